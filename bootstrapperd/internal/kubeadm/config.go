// Package kubeadm drives kubeadm and kubectl on a node: it writes kubeadm's
// configuration (API kubeadm.k8s.io/v1beta4) from what the owner asked for,
// runs `kubeadm init` or `kubeadm join`, and stores the cluster's secrets
// for the key service. The exec code is kept to one seam (Runner) so the
// logic around it is tested without a cluster; real kubeadm runs a control
// plane's first join phases in its tests, all of it in the e2e suite.
package kubeadm

import (
	"bytes"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"net/netip"
	"path/filepath"
	"slices"
	"strconv"

	"sigs.k8s.io/yaml"

	"github.com/orrery-dev/orrery/internal/clusternet"
	"github.com/orrery-dev/orrery/internal/records/admitted"
)

// CRISocket is containerd's socket on every Orrery node.
const CRISocket = "unix:///run/containerd/containerd.sock"

// InitParams are the inputs of `kubeadm init`.
type InitParams struct {
	NodeName          string
	NodeIP            netip.Addr
	KubernetesVersion string
	ClusterName       string
	ServiceCIDR       string
	CertSANs          []string
	// ControlPlaneEndpoint is where every control plane is reached,
	// HOST:PORT, a load balancer in front of them; empty means NodeIP's
	// API server.
	ControlPlaneEndpoint string
	// PatchDir holds kubeadm's patches for the control-plane static pods
	// (see patchFiles); empty means none.
	PatchDir string
	// KubeletServingCA: kubelets' serving certificates come from the
	// kubelet-serving CA (KubeletServingCACert), which must be in
	// CertificatesDir. Without it they come from the cluster CA, as in
	// the clusters made before that CA, whose control planes' static
	// pods are written again at each boot as they were made.
	KubeletServingCA bool
}

type arg struct {
	Name  string `json:"name"`
	Value string `json:"value"`
}

type nodeRegistration struct {
	Name             string `json:"name"`
	CRISocket        string `json:"criSocket"`
	ImagePullPolicy  string `json:"imagePullPolicy"`
	KubeletExtraArgs []arg  `json:"kubeletExtraArgs,omitempty"`
}

type initConfiguration struct {
	APIVersion       string           `json:"apiVersion"`
	Kind             string           `json:"kind"`
	NodeRegistration nodeRegistration `json:"nodeRegistration"`
	LocalAPIEndpoint struct {
		AdvertiseAddress string `json:"advertiseAddress"`
		BindPort         int    `json:"bindPort"`
	} `json:"localAPIEndpoint"`
	Patches  *patches `json:"patches,omitempty"`
	Timeouts timeouts `json:"timeouts"`
	// BootstrapTokens replaces the token kubeadm init would make, which
	// authenticates as system:bootstrappers for 24 hours, and whose
	// holder could have CSRs for any node name auto-approved: nodes join
	// with the join service's certificate, never with a token.
	BootstrapTokens []bootstrapToken `json:"bootstrapTokens"`
}

type bootstrapToken struct {
	TTL string `json:"ttl"`
}

// expiredToken is the one token kubeadm's bootstrap-token phase makes
// (the phase also sets up what kubelets' certificate rotation needs): it
// expires a second after init made it, and the API server refuses it from
// then on. kubeadm refuses a token that only signs: it then has no groups.
var expiredToken = []bootstrapToken{{TTL: "1s"}}

type patches struct {
	Directory string `json:"directory"`
}

func patchesIn(dir string) *patches {
	if dir == "" {
		return nil
	}
	return &patches{Directory: dir}
}

type timeouts struct {
	ControlPlaneComponentHealthCheck string `json:"controlPlaneComponentHealthCheck"`
	KubeletHealthCheck               string `json:"kubeletHealthCheck"`
	KubernetesAPICall                string `json:"kubernetesAPICall"`
	EtcdAPICall                      string `json:"etcdAPICall"`
	TLSBootstrap                     string `json:"tlsBootstrap"`
	Discovery                        string `json:"discovery"`
}

// slowTimeouts are kubeadm's waits, sized for a starved control plane.
var slowTimeouts = timeouts{
	ControlPlaneComponentHealthCheck: controlPlaneHealthCheck,
	KubeletHealthCheck:               kubeletHealthCheck,
	KubernetesAPICall:                apiServerWait,
	EtcdAPICall:                      etcdWait,
	TLSBootstrap:                     tlsBootstrapWait,
	Discovery:                        apiServerWait,
}

type clusterConfiguration struct {
	APIVersion           string `json:"apiVersion"`
	Kind                 string `json:"kind"`
	KubernetesVersion    string `json:"kubernetesVersion"`
	ClusterName          string `json:"clusterName"`
	ControlPlaneEndpoint string `json:"controlPlaneEndpoint"`
	Networking           struct {
		ServiceSubnet string `json:"serviceSubnet"`
		PodSubnet     string `json:"podSubnet"`
	} `json:"networking"`
	APIServer struct {
		CertSANs  []string `json:"certSANs,omitempty"`
		ExtraArgs []arg    `json:"extraArgs,omitempty"`
	} `json:"apiServer"`
	Etcd struct {
		Local component `json:"local"`
	} `json:"etcd"`
	ControllerManager component `json:"controllerManager"`
	Scheduler         component `json:"scheduler"`
	// EncryptionAlgorithm is the type of every key kubeadm generates.
	EncryptionAlgorithm string `json:"encryptionAlgorithm"`
}

// encryptionAlgorithm: ECDSA P-256 keys are generated in microseconds,
// where each of kubeadm's default RSA-2048 keys costs a noticeable share
// of a second natively and ~30 times that in an emulated guest.
const encryptionAlgorithm = "ECDSA-P256"

type component struct {
	ExtraArgs []arg `json:"extraArgs,omitempty"`
}

// leaderElection relaxes the controller manager's and the scheduler's
// leader election from 15 s leases renewed within 10 s. A leader that
// cannot renew within the deadline exits, and its restart (informers
// listing everything, each controller started again) costs a starved
// control plane more than riding the slow spell out would have: the
// controller manager sat in CrashLoopBackOff for minutes under emulation,
// so no DaemonSet pod was created. 60 s leases renewed within 45 s were
// still short with one host core kept busy while a worker joined (TCG,
// 2 host cores): the API server took longer than the lock client's
// per-attempt timeout (half the renew deadline, 22.5 s) twice in a row,
// both components lost their leases and restarted, the controller manager
// took 4.5 min to start its controllers again, and the joined worker had
// no DaemonSet pod 8 min later. Now an attempt may take 50 s (just below
// the API server's 60 s request timeout) and two fit in the deadline.
// The price is a slower take-over when the leader stops without releasing
// its lock: up to two minutes instead of 15 s without a scheduler or a
// controller manager. The scheduler releases its lock when it stops
// cleanly; the controller manager does so only behind an alpha feature
// gate in v1.36, so a restarted one waits for its predecessor's lease to
// run out (a rebooted control plane takes longer than that to come back;
// with one host core kept busy, one that exited during kubeadm init, after
// its fixed 10 s wait for a healthy API server, waited 2m6s). With these
// leases and the same load, neither lost its lease while a worker joined.
//
// The leader renews every retry period, and each renewal is a write to
// etcd: at 5 s the two leases were 24 of the idle API server's 34 lease
// writes a minute. At 15 s a lease of 120 s is still renewed eight times
// before it could run out, and six attempts fit in the renew deadline;
// a candidate waiting for a dead leader's lease tries up to 15 s later.
var leaderElection = []arg{
	{Name: "leader-elect-lease-duration", Value: "120s"},
	{Name: "leader-elect-renew-deadline", Value: "100s"},
	{Name: "leader-elect-retry-period", Value: "15s"},
}

// kubeletCertLifetime is how long the certificates the controller manager
// signs for kubelets last (Kubernetes' default: a year). A node the owner
// removed keeps its kubelet's certificate: the orrery-removed-nodes
// admission policy refuses its writes at once, and this bounds how long it
// can still read what any node may. Kubelets renew theirs from 70 % of
// its life on (kubeadm always turns rotation on), through the CSR flow
// that the same policy closes to removed nodes. Their serving
// certificates ask for less (admitted.ServingCertLifetime: the
// orrery-serving-lifetime policy sets it on each request), which the
// controller manager honours below this bound.
var kubeletCertLifetime = arg{Name: "cluster-signing-duration", Value: strconv.Itoa(int(admitted.KubeletCertLifetime.Hours())) + "h"}

type kubeletConfiguration struct {
	APIVersion   string `json:"apiVersion"`
	Kind         string `json:"kind"`
	CgroupDriver string `json:"cgroupDriver"`
	// Every image is baked in and pinned; garbage collection must never
	// need a registry to get one back.
	ImageGCHighThresholdPercent int `json:"imageGCHighThresholdPercent"`
	// /etc/resolv.conf points at systemd-resolved's stub, which pods
	// cannot reach; kubelet hands them the real upstream servers.
	ResolvConf string `json:"resolvConf"`
	// The journal is not forwarded to the serial console, which the host
	// reads; the owner reads a node's journal through the API server
	// instead (GET /api/v1/nodes/NODE/proxy/logs/?query=UNIT, which needs
	// the nodes/proxy permission).
	EnableSystemLogHandler bool `json:"enableSystemLogHandler"`
	EnableSystemLogQuery   bool `json:"enableSystemLogQuery"`
	// RuntimeRequestTimeout bounds each of kubelet's calls to
	// containerd (default 2 min). On a control plane rebooted on a slow
	// host (TCG on 2 host cores, guests 2.6 times slower than usual)
	// starting kube-proxy's and the join service's containers took
	// longer: kubelet gave up ("RunContainerError: context deadline
	// exceeded"), backed off and started over, so the work containerd
	// had done was lost each time and the pods stayed down for more
	// than 10 min. A call that is slow, not stuck, now finishes; the
	// cluster is shared with this kubelet config, so workers get it
	// too.
	RuntimeRequestTimeout string `json:"runtimeRequestTimeout"`
	// ServerTLSBootstrap: kubelet asks the cluster for its serving
	// certificate (signer kubernetes.io/kubelet-serving) instead of
	// making a self-signed one, and serves nothing on its port until
	// the join service's approver (internal/servingcsr) approved it for
	// the node's name and admitted addresses.
	ServerTLSBootstrap bool `json:"serverTLSBootstrap"`
}

// kubeletServingCA makes the API server check a kubelet's serving
// certificate against the kubelet-serving CA when it connects for
// 'kubectl exec', 'logs', 'port-forward' and a node's journal. Without it
// the API server takes any certificate, and whoever answers at a node's
// address (the host, or root on another node that took the address)
// reads what the owner types into 'kubectl exec' and answers in the
// node's place. It names that CA alone, not the cluster CA: a certificate
// kubeadm or the controller manager signed for anything else is no
// kubelet's.
var kubeletServingCA = arg{Name: "kubelet-certificate-authority", Value: filepath.Join(CertificatesDir, KubeletServingCACert)}

// kubeletClusterCA is kubeletServingCA of a cluster made before the
// kubelet-serving CA: the cluster CA, which signs every other certificate
// too.
var kubeletClusterCA = arg{Name: "kubelet-certificate-authority", Value: filepath.Join(CertificatesDir, "ca.crt")}

// signers: the controller manager signs kubelets' serving certificates
// with the kubelet-serving CA, and every other signer's with the cluster
// CA, as kubeadm's --cluster-signing-{cert,key}-file had it. The
// controller manager refuses that pair of flags beside any per-signer
// one, so kubeadm's are overridden empty.
var signers = func() []arg {
	ca, key := filepath.Join(CertificatesDir, "ca.crt"), filepath.Join(CertificatesDir, "ca.key")
	args := []arg{{Name: "cluster-signing-cert-file", Value: ""}, {Name: "cluster-signing-key-file", Value: ""}}
	for _, s := range []string{"kubelet-client", "kube-apiserver-client", "legacy-unknown"} {
		args = append(args, arg{Name: "cluster-signing-" + s + "-cert-file", Value: ca}, arg{Name: "cluster-signing-" + s + "-key-file", Value: key})
	}
	return append(args,
		arg{Name: "cluster-signing-kubelet-serving-cert-file", Value: filepath.Join(CertificatesDir, KubeletServingCACert)},
		arg{Name: "cluster-signing-kubelet-serving-key-file", Value: filepath.Join(CertificatesDir, KubeletServingCAKey)})
}()

// runtimeRequestTimeout is kubelet's RuntimeRequestTimeout.
const runtimeRequestTimeout = "10m0s"

func nodeReg(name string, ip netip.Addr) nodeRegistration {
	return nodeRegistration{
		Name:      name,
		CRISocket: CRISocket,
		// There is no registry: images come from the OS image.
		ImagePullPolicy: "Never",
		KubeletExtraArgs: []arg{
			{Name: "node-ip", Value: ip.String()},
			// Verbosity 1 puts failed probes in the journal ("Probe
			// failed" with the probe's answer). At 0 a kubelet that kills
			// a starved API server says so only in an event, which goes to
			// that API server: the journal of a control plane starved by a
			// busy host core showed the StopContainer, not why. It adds a
			// line per failed probe, little else.
			{Name: "v", Value: "1"},
		},
	}
}

// InitConfig renders the configuration file for `kubeadm init --config`.
func InitConfig(p InitParams) ([]byte, error) {
	if p.NodeName == "" || !p.NodeIP.IsValid() {
		return nil, fmt.Errorf("kubeadm init config: node name and IP are required")
	}
	ic := initConfiguration{APIVersion: "kubeadm.k8s.io/v1beta4", Kind: "InitConfiguration", NodeRegistration: nodeReg(p.NodeName, p.NodeIP)}
	// Without a default route the API server cannot pick an address itself.
	ic.LocalAPIEndpoint.AdvertiseAddress = p.NodeIP.String()
	ic.LocalAPIEndpoint.BindPort = clusternet.APIServerPort
	ic.Patches = patchesIn(p.PatchDir)
	ic.Timeouts = slowTimeouts
	ic.BootstrapTokens = expiredToken

	cc := clusterConfiguration{APIVersion: "kubeadm.k8s.io/v1beta4", Kind: "ClusterConfiguration",
		KubernetesVersion: p.KubernetesVersion, ClusterName: p.ClusterName,
		ControlPlaneEndpoint: p.endpoint()}
	cc.Networking.ServiceSubnet = p.ServiceCIDR
	cc.Networking.PodSubnet = clusternet.PodCIDR
	cc.APIServer.CertSANs = p.CertSANs
	cc.APIServer.ExtraArgs = append(slices.Clone(apiServerArgs), kubeletClusterCA)
	cc.ControllerManager.ExtraArgs = append(slices.Clone(leaderElection), kubeletCertLifetime)
	if p.KubeletServingCA {
		cc.APIServer.ExtraArgs = append(slices.Clone(apiServerArgs), kubeletServingCA)
		cc.ControllerManager.ExtraArgs = append(cc.ControllerManager.ExtraArgs, signers...)
	}
	cc.Etcd.Local.ExtraArgs = etcdArgs
	cc.EncryptionAlgorithm = encryptionAlgorithm
	cc.Scheduler.ExtraArgs = leaderElection

	kc := kubeletConfiguration{APIVersion: "kubelet.config.k8s.io/v1beta1", Kind: "KubeletConfiguration", CgroupDriver: "systemd", ImageGCHighThresholdPercent: 100,
		ResolvConf: "/run/systemd/resolve/resolv.conf", EnableSystemLogHandler: true, EnableSystemLogQuery: true,
		RuntimeRequestTimeout: runtimeRequestTimeout, ServerTLSBootstrap: true}
	return documents(ic, cc, kc)
}

// endpoint is p's control-plane endpoint, HOST:PORT.
func (p InitParams) endpoint() string {
	if p.ControlPlaneEndpoint != "" {
		return p.ControlPlaneEndpoint
	}
	return netip.AddrPortFrom(p.NodeIP, clusternet.APIServerPort).String()
}

// JoinParams are the inputs of `kubeadm join`.
type JoinParams struct {
	NodeName string
	NodeIP   netip.Addr
	// Endpoint is the API server, host:port.
	Endpoint string
	// CACert (DER) is the cluster CA, through which the node trusts the
	// API server. ClientCert (DER) and ClientKey (PEM) are the node's
	// client certificate from the join service (system:node:<name>):
	// kubelet bootstraps with it, so no bootstrap token is involved.
	CACert, ClientCert, ClientKey []byte
	ControlPlane                  bool
	// KubernetesVersion is the version the cluster runs (the ticket's):
	// the release of the image whose kubeadm joins, and whose kubelet
	// then runs. kubeadm join itself takes its own version.
	KubernetesVersion string
	// PatchDir: see InitParams.
	PatchDir string
}

type joinConfiguration struct {
	APIVersion       string           `json:"apiVersion"`
	Kind             string           `json:"kind"`
	NodeRegistration nodeRegistration `json:"nodeRegistration"`
	Discovery        struct {
		File struct {
			KubeConfigPath string `json:"kubeConfigPath"`
		} `json:"file"`
	} `json:"discovery"`
	ControlPlane *struct {
		LocalAPIEndpoint struct {
			AdvertiseAddress string `json:"advertiseAddress"`
			BindPort         int    `json:"bindPort"`
		} `json:"localAPIEndpoint"`
	} `json:"controlPlane,omitempty"`
	Patches  *patches `json:"patches,omitempty"`
	Timeouts timeouts `json:"timeouts"`
}

// JoinConfig renders the configuration file for `kubeadm join --config`,
// which finds the cluster through the kubeconfig at discoveryFile (see
// DiscoveryKubeconfig).
func JoinConfig(p JoinParams, discoveryFile string) ([]byte, error) {
	if p.NodeName == "" || !p.NodeIP.IsValid() || discoveryFile == "" {
		return nil, fmt.Errorf("kubeadm join config: node name, IP and discovery kubeconfig are required")
	}
	jc := joinConfiguration{APIVersion: "kubeadm.k8s.io/v1beta4", Kind: "JoinConfiguration", NodeRegistration: nodeReg(p.NodeName, p.NodeIP)}
	jc.Discovery.File.KubeConfigPath = discoveryFile
	jc.Patches = patchesIn(p.PatchDir)
	jc.Timeouts = slowTimeouts
	if p.ControlPlane {
		jc.ControlPlane = &struct {
			LocalAPIEndpoint struct {
				AdvertiseAddress string `json:"advertiseAddress"`
				BindPort         int    `json:"bindPort"`
			} `json:"localAPIEndpoint"`
		}{}
		jc.ControlPlane.LocalAPIEndpoint.AdvertiseAddress = p.NodeIP.String()
		jc.ControlPlane.LocalAPIEndpoint.BindPort = clusternet.APIServerPort
	}
	return documents(jc)
}

func documents(docs ...any) ([]byte, error) {
	var b bytes.Buffer
	for i, d := range docs {
		y, err := yaml.Marshal(d)
		if err != nil {
			return nil, err
		}
		if i > 0 {
			b.WriteString("---\n")
		}
		b.Write(y)
	}
	return b.Bytes(), nil
}

// DiscoveryKubeconfig renders the kubeconfig `kubeadm join` discovers the
// cluster with (kubeadm's file discovery): the API server at p.Endpoint,
// trusted through p.CACert, and the node's client certificate and key,
// embedded. kubeadm gives it to kubelet as its bootstrap kubeconfig, and
// kubelet asks for its own certificate with the node's: the cluster
// approves that only for the name in the certificate.
func DiscoveryKubeconfig(p JoinParams) ([]byte, error) {
	if p.Endpoint == "" || len(p.CACert) == 0 || len(p.ClientCert) == 0 || len(p.ClientKey) == 0 {
		return nil, fmt.Errorf("discovery kubeconfig: endpoint, cluster CA, client certificate and key are required")
	}
	if _, err := x509.ParseCertificate(p.CACert); err != nil {
		return nil, fmt.Errorf("discovery kubeconfig: the cluster CA certificate does not parse: %w", err)
	}
	if _, err := x509.ParseCertificate(p.ClientCert); err != nil {
		return nil, fmt.Errorf("discovery kubeconfig: the node's client certificate does not parse: %w", err)
	}
	pemCert := func(der []byte) []byte { return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}) }
	const name = "orrery"
	kc := map[string]any{
		"apiVersion": "v1",
		"kind":       "Config",
		"clusters": []any{map[string]any{"name": name, "cluster": map[string]any{
			"server":                     "https://" + p.Endpoint,
			"certificate-authority-data": pemCert(p.CACert),
		}}},
		"users": []any{map[string]any{"name": name, "user": map[string]any{
			"client-certificate-data": pemCert(p.ClientCert),
			"client-key-data":         p.ClientKey,
		}}},
		"contexts":        []any{map[string]any{"name": name, "context": map[string]any{"cluster": name, "user": name}}},
		"current-context": name,
	}
	return yaml.Marshal(kc)
}
