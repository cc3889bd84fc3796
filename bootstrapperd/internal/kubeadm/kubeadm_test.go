package kubeadm

import (
	"bytes"
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/resource"
	"sigs.k8s.io/yaml"

	"github.com/orrery-dev/orrery/internal/attestation"
	"github.com/orrery-dev/orrery/internal/clusternet"
	"github.com/orrery-dev/orrery/internal/keys"
	"github.com/orrery-dev/orrery/internal/testkit/apiservertest"
	"github.com/orrery-dev/orrery/internal/versions"
)

// splitDocs parses a multi-document YAML file into generic maps.
func splitDocs(t *testing.T, raw []byte) []map[string]any {
	t.Helper()
	var out []map[string]any
	for _, doc := range strings.Split(string(raw), "\n---\n") {
		var m map[string]any
		if err := yaml.Unmarshal([]byte(doc), &m); err != nil {
			t.Fatalf("document does not parse: %v\n%s", err, doc)
		}
		out = append(out, m)
	}
	return out
}

func get(m map[string]any, path ...string) any {
	var cur any = m
	for _, p := range path {
		mm, ok := cur.(map[string]any)
		if !ok {
			return nil
		}
		cur = mm[p]
	}
	return cur
}

// Kubelets serve with certificates from the cluster, and the API server
// checks them.
func TestInitConfigVerifiesKubelets(t *testing.T) {
	raw, err := InitConfig(InitParams{NodeName: "cp-0", NodeIP: netip.MustParseAddr("10.42.1.100")})
	if err != nil {
		t.Fatal(err)
	}
	docs := splitDocs(t, raw)
	if got := get(docs[2], "serverTLSBootstrap"); got != true {
		t.Errorf("serverTLSBootstrap = %v, want true", got)
	}
	if args := extraArgs(docs[1], "apiServer", "extraArgs"); args["kubelet-certificate-authority"] != "/etc/kubernetes/pki/ca.crt" {
		t.Errorf("apiServer extraArgs = %v, want kubelets' serving certificates checked against the cluster CA", args)
	}
}

func TestInitConfig(t *testing.T) {
	raw, err := InitConfig(InitParams{NodeName: "cp-0", NodeIP: netip.MustParseAddr("10.42.1.100"), KubernetesVersion: "v1.36.3",
		ClusterName: "demo", ServiceCIDR: "10.96.0.0/12", CertSANs: []string{"api.example.org"}, PatchDir: "/run/orrery/kubeadm-patches"})
	if err != nil {
		t.Fatal(err)
	}
	docs := splitDocs(t, raw)
	if len(docs) != 3 {
		t.Fatalf("%d documents, want 3", len(docs))
	}
	checks := []struct {
		doc  int
		path []string
		want any
	}{
		{0, []string{"kind"}, "InitConfiguration"},
		{0, []string{"apiVersion"}, "kubeadm.k8s.io/v1beta4"},
		{0, []string{"localAPIEndpoint", "advertiseAddress"}, "10.42.1.100"},
		{0, []string{"nodeRegistration", "imagePullPolicy"}, "Never"},
		{0, []string{"nodeRegistration", "criSocket"}, CRISocket},
		{1, []string{"kind"}, "ClusterConfiguration"},
		{1, []string{"kubernetesVersion"}, "v1.36.3"},
		{1, []string{"clusterName"}, "demo"},
		{1, []string{"controlPlaneEndpoint"}, "10.42.1.100:6443"},
		{1, []string{"networking", "serviceSubnet"}, "10.96.0.0/12"},
		{1, []string{"networking", "podSubnet"}, clusternet.PodCIDR},
		{0, []string{"patches", "directory"}, "/run/orrery/kubeadm-patches"},
		{0, []string{"timeouts", "controlPlaneComponentHealthCheck"}, "15m0s"},
		{0, []string{"timeouts", "kubernetesAPICall"}, "15m0s"},
		{0, []string{"timeouts", "etcdAPICall"}, "15m0s"},
		{1, []string{"encryptionAlgorithm"}, "ECDSA-P256"},
		{2, []string{"cgroupDriver"}, "systemd"},
		// The owner reads node journals through the API, not the console.
		{2, []string{"enableSystemLogQuery"}, true},
		{2, []string{"enableSystemLogHandler"}, true},
		// A slow container start must finish, not start over.
		{2, []string{"runtimeRequestTimeout"}, "10m0s"},
	}
	for _, c := range checks {
		if got := get(docs[c.doc], c.path...); got != c.want {
			t.Errorf("doc %d %v = %v, want %v", c.doc, c.path, got, c.want)
		}
	}
	if sans := get(docs[1], "apiServer", "certSANs").([]any); len(sans) != 1 || sans[0] != "api.example.org" {
		t.Errorf("certSANs = %v", sans)
	}
	for _, comp := range []string{"controllerManager", "scheduler"} {
		args := extraArgs(docs[1], comp, "extraArgs")
		if args["leader-elect-lease-duration"] != "120s" || args["leader-elect-renew-deadline"] != "100s" || args["leader-elect-retry-period"] != "15s" {
			t.Errorf("%s extraArgs = %v, want the relaxed leader election", comp, args)
		}
	}
	// A removed node's certificate dies within a week.
	if args := extraArgs(docs[1], "controllerManager", "extraArgs"); args["cluster-signing-duration"] != "168h" {
		t.Errorf("controllerManager extraArgs = %v, want kubelet certificates signed for a week", args)
	}
	// kubeadm's token is dead a second after init.
	if toks, _ := get(docs[0], "bootstrapTokens").([]any); len(toks) != 1 || fmt.Sprint(get(toks[0].(map[string]any), "ttl")) != "1s" {
		t.Errorf("bootstrapTokens = %v, want one that expires at once", get(docs[0], "bootstrapTokens"))
	}
	if args := extraArgs(docs[1], "etcd", "local", "extraArgs"); args["election-timeout"] != "5000" || args["heartbeat-interval"] != "500" {
		t.Errorf("etcd extraArgs = %v, want the slower raft clock", args)
	}
	if args := extraArgs(docs[1], "etcd", "local", "extraArgs"); args["watch-progress-notify-interval"] != "30s" {
		t.Errorf("etcd extraArgs = %v, want progress notifications every 30 s", args)
	}
	if args := extraArgs(docs[1], "apiServer", "extraArgs"); args["etcd-healthcheck-timeout"] != "10s" || args["etcd-readycheck-timeout"] != "10s" {
		t.Errorf("apiServer extraArgs = %v, want 10 s etcd checks", args)
	}

	// Failed probes must reach the journal, which a failed init reports.
	if args := extraArgs(docs[0], "nodeRegistration", "kubeletExtraArgs"); args["node-ip"] != "10.42.1.100" || args["v"] != "1" {
		t.Errorf("kubeletExtraArgs = %v, want the node IP and verbosity 1", args)
	}
	raw, _ = InitConfig(InitParams{NodeName: "cp-0", NodeIP: netip.MustParseAddr("10.42.1.100")})
	if get(splitDocs(t, raw)[0], "patches") != nil {
		t.Errorf("no PatchDir, but the config names a patch directory:\n%s", raw)
	}
	if _, err := InitConfig(InitParams{}); err == nil {
		t.Error("empty params accepted")
	}
}

// A cluster behind a load balancer names it, and only it: a second
// control plane then needs no new certificate.
func TestInitConfigNamesTheEndpoint(t *testing.T) {
	raw, _ := InitConfig(InitParams{NodeName: "cp-0", NodeIP: netip.MustParseAddr("10.42.1.100"), ControlPlaneEndpoint: "10.42.0.2:6443"})
	if got := get(splitDocs(t, raw)[1], "controlPlaneEndpoint"); got != "10.42.0.2:6443" {
		t.Errorf("controlPlaneEndpoint = %v, want the load balancer 10.42.0.2:6443", got)
	}
}

func TestJoinConfig(t *testing.T) {
	p := JoinParams{NodeName: "w-0", NodeIP: netip.MustParseAddr("10.42.2.100"), Endpoint: "10.42.1.100:6443"}
	raw, err := JoinConfig(p, "/run/d.conf")
	if err != nil {
		t.Fatal(err)
	}
	doc := splitDocs(t, raw)[0]
	if get(doc, "discovery", "file", "kubeConfigPath") != "/run/d.conf" || get(doc, "controlPlane") != nil {
		t.Fatalf("worker join config: %s", raw)
	}
	// A bootstrap token lets its holder ask for any node's certificate.
	if get(doc, "discovery", "bootstrapToken") != nil || get(doc, "discovery", "tlsBootstrapToken") != nil {
		t.Fatalf("join config uses a bootstrap token: %s", raw)
	}
	if _, err := JoinConfig(p, ""); err == nil {
		t.Error("join config without a discovery kubeconfig accepted")
	}
	p.ControlPlane, p.PatchDir = true, "/run/p"
	raw, _ = JoinConfig(p, "/run/d.conf")
	doc = splitDocs(t, raw)[0]
	if get(doc, "controlPlane", "localAPIEndpoint", "advertiseAddress") != "10.42.2.100" || get(doc, "patches", "directory") != "/run/p" {
		t.Fatalf("control-plane join config: %s", raw)
	}
}

func extraArgs(doc map[string]any, path ...string) map[string]string {
	args := map[string]string{}
	list, _ := get(doc, path...).([]any)
	for _, a := range list {
		m := a.(map[string]any)
		args[m["name"].(string)] = m["value"].(string)
	}
	return args
}

type call struct {
	name  string
	args  []string
	stdin []byte
}

type fakeRunner struct {
	calls  []call
	onRun  func(call) error
	output string
}

func (f *fakeRunner) Run(_ context.Context, name string, args []string, stdin io.Reader, out io.Writer) error {
	c := call{name: name, args: args}
	if stdin != nil {
		c.stdin, _ = io.ReadAll(stdin)
	}
	f.calls = append(f.calls, c)
	io.WriteString(out, f.output)
	if f.onRun != nil {
		return f.onRun(c)
	}
	return nil
}

func TestInitRunsKubeadmAndReturnsKubeconfig(t *testing.T) {
	dir := t.TempDir()
	admin := filepath.Join(dir, "admin.conf")
	r := &fakeRunner{output: "[init] Using Kubernetes version: v1.36.3\n", onRun: func(c call) error {
		// kubeadm writes the admin kubeconfig.
		return os.WriteFile(admin, []byte("kubeconfig"), 0o600)
	}}
	pki := filepath.Join(dir, "pki")
	r.onRun = func(c call) error {
		// kubeadm finds the kubelet-serving CA that its controller
		// manager and API server name.
		if _, _, err := readKubeletServingCA(pki, time.Now()); err != nil {
			t.Errorf("when kubeadm init runs: %v", err)
		}
		return os.WriteFile(admin, []byte("kubeconfig"), 0o600)
	}
	tool := &Tool{Runner: r, ConfigDir: filepath.Join(dir, "run"), AdminKubeconfig: admin, PKIDir: pki}
	var out bytes.Buffer
	kc, err := tool.Init(context.Background(), InitParams{NodeName: "cp-0", NodeIP: netip.MustParseAddr("10.42.1.100"), KubernetesVersion: "v1.36.3", ServiceCIDR: "10.96.0.0/12"}, &out)
	if err != nil || string(kc) != "kubeconfig" {
		t.Fatalf("Init = %q, %v", kc, err)
	}
	if len(r.calls) != 1 || r.calls[0].name != "kubeadm" || r.calls[0].args[0] != "init" || !strings.Contains(out.String(), "Using Kubernetes") {
		t.Fatalf("calls %v, output %q", r.calls, out.String())
	}
	st, err := os.Stat(r.calls[0].args[2])
	if err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("config file: %v %v", st, err)
	}

	r.onRun = func(call) error { return errors.New("kubeadm init: exit status 1") }
	if _, err := tool.Init(context.Background(), InitParams{NodeName: "cp-0", NodeIP: netip.MustParseAddr("10.42.1.100")}, io.Discard); err == nil {
		t.Fatal("kubeadm failure not reported")
	}
}

func TestStoreMasterSecret(t *testing.T) {
	r := &fakeRunner{}
	tool := &Tool{Runner: r, AdminKubeconfig: "/etc/kubernetes/admin.conf"}
	ms := keys.MasterSecret{Key: bytes.Repeat([]byte{1}, 32), Salt: bytes.Repeat([]byte{2}, 32)}
	salt := bytes.Repeat([]byte{3}, 32)
	if err := tool.StoreMasterSecret(context.Background(), ms, salt); err != nil {
		t.Fatal(err)
	}
	c := r.calls[0]
	if c.name != "kubectl" || strings.Join(c.args, " ") != "--kubeconfig /etc/kubernetes/admin.conf apply --server-side --validate=false -f -" {
		t.Fatalf("call %v", c)
	}
	for _, a := range c.args {
		if strings.Contains(a, base64.StdEncoding.EncodeToString(ms.Key)[:10]) {
			t.Fatal("the master secret is on the command line")
		}
	}
	docs := splitDocs(t, c.stdin)
	file, _ := base64.StdEncoding.DecodeString(get(docs[0], "data", MasterSecretKey).(string))
	path := filepath.Join(t.TempDir(), "ms.json")
	os.WriteFile(path, file, 0o600)
	got, err := keys.ReadMasterSecretFile(path)
	if err != nil || !bytes.Equal(got.Key, ms.Key) || !bytes.Equal(got.Salt, ms.Salt) {
		t.Fatalf("Secret does not hold the master secret in the key service's file format: %v", err)
	}
	if s, _ := base64.StdEncoding.DecodeString(get(docs[1], "data", MeasurementSaltKey).(string)); !bytes.Equal(s, salt) {
		t.Fatal("ConfigMap does not hold the measurement salt")
	}
	if cps := get(docs[1], "data", ControlPlanesKey); cps != nil {
		t.Fatalf("a node that knows no instance of its own approved control planes %q", cps)
	}

	// The initialised node approves itself as a control plane.
	tool.Instance = attestation.Instance{Name: "cp-0", ID: "4242"}
	if err := tool.StoreMasterSecret(context.Background(), ms, salt); err != nil {
		t.Fatal(err)
	}
	docs = splitDocs(t, r.calls[1].stdin)
	if cps, _ := get(docs[1], "data", ControlPlanesKey).(string); strings.TrimSpace(cps) != "4242" {
		t.Fatalf("%s = %q, want the initialised node's instance ID", ControlPlanesKey, cps)
	}
	// The record of its own disk is the owner's to write (AdmittedNode,
	// whose definition the cluster gets only with Orrery's charts).
	if len(docs) != 2 {
		t.Fatalf("%d documents, want the Secret and the ConfigMap", len(docs))
	}
}

// The patches must be what kubeadm reads: one strategic merge patch per
// control-plane pod, naming that pod's container, with a liveness probe
// that survives two minutes of starvation; the API server's no longer
// asks etcd.
func TestControlPlanePatches(t *testing.T) {
	dir := t.TempDir()
	admin := filepath.Join(dir, "admin.conf")
	r := &fakeRunner{onRun: func(c call) error { return os.WriteFile(admin, []byte("kubeconfig"), 0o600) }}
	tool := &Tool{Runner: r, ConfigDir: filepath.Join(dir, "run"), AdminKubeconfig: admin, PKIDir: filepath.Join(dir, "pki")}
	if _, err := tool.Init(context.Background(), InitParams{NodeName: "cp-0", NodeIP: netip.MustParseAddr("10.42.1.100"), ControlPlaneEndpoint: "10.42.0.2:6443"}, io.Discard); err != nil {
		t.Fatal(err)
	}
	cfg, _ := os.ReadFile(r.calls[0].args[2])
	patchDir, _ := get(splitDocs(t, cfg)[0], "patches", "directory").(string)
	if patchDir == "" {
		t.Fatalf("the init config names no patch directory:\n%s", cfg)
	}
	for target, wantPath := range map[string]string{
		"kube-apiserver": "/livez?exclude=etcd", "etcd": "", "kube-controller-manager": "", "kube-scheduler": "",
	} {
		checkComponentPatch(t, patchDir, target, wantPath)
	}
	checkCoreDNSPatch(t, patchDir)

	// A worker's join runs no control plane: its only patch takes the
	// static pod path out of its kubelet's configuration.
	r.onRun = func(c call) error {
		raw, _ := os.ReadFile(c.args[2])
		dir, _ := get(splitDocs(t, raw)[0], "patches", "directory").(string)
		entries, err := os.ReadDir(dir)
		if err != nil || len(entries) != 1 || entries[0].Name() != "kubeletconfiguration+merge.yaml" {
			t.Errorf("a worker's join patches (%v): %v, want the kubelet configuration's alone", err, entries)
			return nil
		}
		patch, _ := os.ReadFile(filepath.Join(dir, entries[0].Name()))
		var m map[string]any
		if err := yaml.Unmarshal(patch, &m); err != nil || len(m) != 1 || m["staticPodPath"] != nil {
			t.Errorf("a worker's kubelet patch %q: %v, want staticPodPath removed (null) and nothing else", patch, err)
		}
		if v, ok := m["staticPodPath"]; !ok || v != nil {
			t.Errorf("a worker's kubelet patch %q does not remove staticPodPath", patch)
		}
		return nil
	}
	if err := tool.Join(context.Background(), testJoinParams(t), io.Discard); err != nil {
		t.Fatal(err)
	}
}

// componentPatch is what a control-plane component's patch may set.
type componentPatch struct {
	Spec struct {
		Containers []struct {
			Name                     string `json:"name"`
			TerminationMessagePolicy string `json:"terminationMessagePolicy"`
			LivenessProbe            struct {
				HTTPGet *struct {
					Path string `json:"path"`
				} `json:"httpGet"`
				PeriodSeconds    int `json:"periodSeconds"`
				TimeoutSeconds   int `json:"timeoutSeconds"`
				FailureThreshold int `json:"failureThreshold"`
			} `json:"livenessProbe"`
			ReadinessProbe *struct {
				PeriodSeconds  int `json:"periodSeconds"`
				TimeoutSeconds int `json:"timeoutSeconds"`
			} `json:"readinessProbe"`
			Resources *struct {
				Requests struct {
					CPU resource.Quantity `json:"cpu"`
				} `json:"requests"`
			} `json:"resources"`
		} `json:"containers"`
	} `json:"spec"`
}

// checkComponentPatch checks target's patch in patchDir; wantPath is its
// liveness probe's HTTP path ("" for kubeadm's own probe).
func checkComponentPatch(t *testing.T, patchDir, target, wantPath string) {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join(patchDir, target+"+strategic.yaml"))
	if err != nil {
		t.Fatalf("patch for %s: %v", target, err)
	}
	var patch componentPatch
	if err := yaml.UnmarshalStrict(raw, &patch); err != nil {
		t.Fatalf("patch for %s does not parse: %v\n%s", target, err, raw)
	}
	if len(patch.Spec.Containers) != 1 || patch.Spec.Containers[0].Name != target {
		t.Fatalf("patch for %s patches %+v", target, patch.Spec.Containers)
	}
	c := patch.Spec.Containers[0]
	// A component that exits leaves its last lines in the pod's status.
	if c.TerminationMessagePolicy != "FallbackToLogsOnError" {
		t.Errorf("%s terminationMessagePolicy %q, want FallbackToLogsOnError", target, c.TerminationMessagePolicy)
	}
	lp := c.LivenessProbe
	if lp.TimeoutSeconds*lp.FailureThreshold < 120 || lp.PeriodSeconds*lp.FailureThreshold < 120 {
		t.Errorf("%s is killed after %d misses %d s apart (each waited %d s), want at least two minutes", target, lp.FailureThreshold, lp.PeriodSeconds, lp.TimeoutSeconds)
	}
	// Probed every 30 s, not kubeadm's 10 s: the same kill window with a
	// third of the handshakes.
	if lp.PeriodSeconds < 30 || lp.TimeoutSeconds > lp.PeriodSeconds {
		t.Errorf("%s liveness probe every %d s with a %d s timeout, want every 30 s or slower, within its period", target, lp.PeriodSeconds, lp.TimeoutSeconds)
	}
	gotPath := ""
	if lp.HTTPGet != nil {
		gotPath = lp.HTTPGet.Path
	}
	if gotPath != wantPath {
		t.Errorf("%s liveness path %q, want %q", target, gotPath, wantPath)
	}
	// etcd and the API server come first when the node's CPU is short;
	// the others keep kubeadm's requests.
	if target == "etcd" || target == "kube-apiserver" {
		if c.Resources == nil || c.Resources.Requests.CPU.Cmp(resource.MustParse("500m")) < 0 {
			t.Errorf("%s requests %+v of CPU, want at least 500m", target, c.Resources)
		}
	} else if c.Resources != nil {
		t.Errorf("%s's resources patched: %+v, want kubeadm's", target, c.Resources)
	}
	// kubeadm gives these three a readiness probe every second; the
	// controller manager has none, and a patch must not add one.
	rp := c.ReadinessProbe
	if hasReadiness := target != "kube-controller-manager"; hasReadiness != (rp != nil) {
		t.Errorf("%s readiness probe patched: %v, want %v", target, rp != nil, hasReadiness)
	} else if rp != nil && (rp.PeriodSeconds < 10 || rp.TimeoutSeconds > rp.PeriodSeconds) {
		t.Errorf("%s readiness probe every %d s with a %d s timeout, want every 10 s or slower, within its period", target, rp.PeriodSeconds, rp.TimeoutSeconds)
	}
}

// checkCoreDNSPatch checks that CoreDNS reaches the API server at the
// control-plane endpoint, not through the kubernetes Service, which needs
// kube-proxy first.
func checkCoreDNSPatch(t *testing.T, patchDir string) {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join(patchDir, "corednsdeployment+strategic.yaml"))
	if err != nil {
		t.Fatalf("no CoreDNS patch: %v", err)
	}
	var dns struct {
		Spec struct {
			Template struct {
				Spec struct {
					NodeSelector map[string]string `json:"nodeSelector"`
					Containers   []struct {
						Name string `json:"name"`
						Env  []struct {
							Name  string `json:"name"`
							Value string `json:"value"`
						} `json:"env"`
					} `json:"containers"`
				} `json:"spec"`
			} `json:"template"`
		} `json:"spec"`
	}
	if err := yaml.UnmarshalStrict(raw, &dns); err != nil {
		t.Fatalf("CoreDNS patch does not parse: %v\n%s", err, raw)
	}
	if sel := dns.Spec.Template.Spec.NodeSelector; len(sel) != 1 || sel["node-role.kubernetes.io/control-plane"] != "" {
		t.Errorf("CoreDNS node selector %v; want control planes only", sel)
	}
	cs := dns.Spec.Template.Spec.Containers
	if len(cs) != 1 || cs[0].Name != "coredns" || len(cs[0].Env) != 2 ||
		cs[0].Env[0].Name != "KUBERNETES_SERVICE_HOST" || cs[0].Env[0].Value != "10.42.0.2" ||
		cs[0].Env[1].Name != "KUBERNETES_SERVICE_PORT" || cs[0].Env[1].Value != "6443" {
		t.Fatalf("CoreDNS patch %+v; want the control-plane endpoint 10.42.0.2:6443", cs)
	}
}

// The real kubeadm decodes both configurations strictly: a misspelt field
// (a timeout kubeadm does not know) would otherwise be ignored and the
// node would run with kubeadm's default.
func TestConfigsPassKubeadmValidation(t *testing.T) {
	bin := apiservertest.Kubeadm(t)
	dir := t.TempDir()
	discovery := filepath.Join(dir, "discovery.conf")
	if err := os.WriteFile(discovery, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	ip := netip.MustParseAddr("10.42.1.100")
	initCfg, err := InitConfig(InitParams{NodeName: "cp-0", NodeIP: ip, KubernetesVersion: versions.Default,
		ClusterName: "orrery", ServiceCIDR: clusternet.DefaultServiceCIDR, PatchDir: dir})
	if err != nil {
		t.Fatal(err)
	}
	worker, err := JoinConfig(JoinParams{NodeName: "worker-0", NodeIP: ip, Endpoint: "10.42.1.100:6443"}, discovery)
	if err != nil {
		t.Fatal(err)
	}
	controlPlane, err := JoinConfig(JoinParams{NodeName: "cp-1", NodeIP: ip, Endpoint: "10.42.1.100:6443", ControlPlane: true, PatchDir: dir}, discovery)
	if err != nil {
		t.Fatal(err)
	}
	upgrade, err := UpgradeConfig(UpgradeParams{KubernetesVersion: versions.Default, Apply: true, ControlPlane: true, PatchDir: dir})
	if err != nil {
		t.Fatal(err)
	}
	for name, cfg := range map[string][]byte{"init": initCfg, "worker join": worker, "control-plane join": controlPlane, "upgrade": upgrade} {
		path := filepath.Join(dir, "config.yaml")
		if err := os.WriteFile(path, cfg, 0o600); err != nil {
			t.Fatal(err)
		}
		if out, err := exec.Command(bin, "config", "validate", "--config", path).CombinedOutput(); err != nil {
			t.Errorf("kubeadm config validate, %s configuration: %v\n%s\n%s", name, err, out, cfg)
		}
	}
	for field, want := range map[string]string{"kubernetesAPICall": apiServerWait, "tlsBootstrap": tlsBootstrapWait, "discovery": apiServerWait, "kubeletHealthCheck": kubeletHealthCheck} {
		if get(splitDocs(t, worker)[0], "timeouts", field) != want {
			t.Errorf("join configuration's timeouts.%s is not %s:\n%s", field, want, worker)
		}
	}
}
