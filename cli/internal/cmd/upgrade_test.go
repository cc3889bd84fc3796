package cmd

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"helm.sh/helm/v3/pkg/action"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/orrery-dev/orrery/internal/attestation/measurements"
	"github.com/orrery-dev/orrery/internal/owner/charts"
	"github.com/orrery-dev/orrery/internal/owner/clusterstatus"
	"github.com/orrery-dev/orrery/internal/owner/services"
	"github.com/orrery-dev/orrery/internal/owner/upgrade"
	"github.com/orrery-dev/orrery/internal/records/controlplanes"
	"github.com/orrery-dev/orrery/internal/records/measurementset"
	"github.com/orrery-dev/orrery/internal/testkit/apiservertest"
)

func writeSet(t *testing.T, b byte, warnOnly bool) (string, measurementset.Set) {
	t.Helper()
	m := measurements.M{4: {Expected: bytes.Repeat([]byte{b}, 32), WarnOnly: warnOnly}}
	raw, err := m.MarshalJSON()
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "measurements.json")
	if err := os.WriteFile(path, raw, 0o644); err != nil {
		t.Fatal(err)
	}
	s, _ := measurementset.New(m, "")
	return path, s
}

// initialised installs Orrery's real charts as 'orrery init' does, into a
// real API server (without waiting: nothing runs pods there).
func initialised(t *testing.T, set measurementset.Set) string {
	t.Helper()
	srv := apiservertest.Start(t)
	rs, err := services.Releases(services.Settings{APIServer: "10.42.1.100:6443", PodCIDR: "10.244.0.0/16",
		MeasurementSets: []measurementset.Set{set}, PlatformCA: []byte("PEM")})
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range rs {
		hc, err := services.HelmConfig(srv.Kubeconfig, r.Namespace)
		if err != nil {
			t.Fatal(err)
		}
		c, err := charts.Load(r.Chart)
		if err != nil {
			t.Fatal(err)
		}
		in := action.NewInstall(hc)
		in.ReleaseName, in.Namespace, in.Timeout = r.Name, r.Namespace, time.Minute
		in.Wait = r.Chart == charts.OrreryCRDs // the CRDs must be served before the sets
		in.Description = services.Description("init")
		if _, err := in.Run(c, r.Values); err != nil {
			t.Fatalf("install %s: %v", r.Name, err)
		}
	}
	return srv.Kubeconfig
}

func run(t *testing.T, stdin string, args ...string) (string, string, int) {
	t.Helper()
	var out, errOut bytes.Buffer
	root := newRootCmd()
	// A workspace of its own, where apply leaves its log.
	root.SetArgs(append(args, "--workspace", t.TempDir()))
	root.SetIn(strings.NewReader(stdin))
	root.SetOut(&out)
	root.SetErr(&errOut)
	code := 0
	if err := root.ExecuteContext(context.Background()); err != nil {
		errOut.WriteString(err.Error())
		code = 1
	}
	return out.String(), errOut.String(), code
}

func TestUpgradeCommands(t *testing.T) {
	_, initSet := writeSet(t, 1, false)
	kubeconfig := initialised(t, initSet)
	backups := filepath.Join(t.TempDir(), "backups")

	// The orrery that installed it has nothing to do.
	out, errOut, code := run(t, "", "upgrade", "apply", "--kubeconfig", kubeconfig, "--backup-dir", backups, "--yes")
	if code != 0 || !strings.Contains(out, "Everything is current") {
		t.Fatalf("exit %d: %s%s", code, out, errOut)
	}
	out, errOut, code = run(t, "", "upgrade", "check", "--kubeconfig", kubeconfig, "-o", "json")
	var r upgrade.Report
	if code != 0 || json.Unmarshal([]byte(out), &r) != nil || !r.UpToDate || len(r.Releases) != 3 || len(r.Images) != 1 || r.Images[0].Set != initSet.Name {
		t.Fatalf("check: exit %d, %+v: %s%s", code, r, out, errOut)
	}

	checkNewImageNotApplied(t, kubeconfig, backups, initSet)

	// Measurements that enforce nothing are refused before the cluster is
	// asked anything.
	weak, _ := writeSet(t, 3, true)
	if _, errOut, code := run(t, "", "upgrade", "apply", "--kubeconfig", kubeconfig, "--measurements", weak, "--yes"); code == 0 || !strings.Contains(errOut, "enforce no PCR") {
		t.Errorf("warnOnly measurements: exit %d: %s", code, errOut)
	}

	checkControlPlaneApproval(t, kubeconfig)

	// Every data-printing command's YAML is its JSON.
	runArgs := func(args ...string) (string, string, int) { return run(t, "", args...) }
	for _, args := range [][]string{
		{"upgrade", "check", "--kubeconfig", kubeconfig},
		{"status", "--kubeconfig", kubeconfig},
		{"control-plane", "list", "--kubeconfig", kubeconfig},
	} {
		checkYAMLMatchesJSON(t, runArgs, args)
	}

	// status: the releases, unhealthy here (no pod runs without a kubelet).
	out, errOut, code = run(t, "", "status", "--kubeconfig", kubeconfig, "-o", "json")
	var st clusterstatus.Report
	if code != 0 || json.Unmarshal([]byte(out), &st) != nil || len(st.Releases) != 3 || st.Behind {
		t.Fatalf("status: exit %d, %+v: %s%s", code, st, out, errOut)
	}
	for _, rel := range st.Releases {
		if rel.Name == "orrery-services" && (rel.Healthy || !strings.Contains(strings.Join(rel.Problems, ";"), "DaemonSet kube-system/orrery-joinservice: 0 of 0 ready")) {
			t.Errorf("orrery-services without running pods: %+v", rel)
		}
	}
}

// checkNewImageNotApplied offers the cluster at kubeconfig, installed
// with initSet, a new image that is shown and checked but never applied.
func checkNewImageNotApplied(t *testing.T, kubeconfig, backups string, initSet measurementset.Set) {
	t.Helper()
	// A new image: shown, asked about, and not applied without a yes.
	newPath, newSet := writeSet(t, 2, false)
	out, errOut, code := run(t, "n\n", "upgrade", "apply", "--kubeconfig", kubeconfig, "--backup-dir", backups, "--measurements", newPath)
	if code != 0 || !strings.Contains(out, "orrery-services: accept image "+newSet.Name) || !strings.Contains(out, "Nothing was changed") {
		t.Fatalf("declined: exit %d: %s%s", code, out, errOut)
	}
	_, errOut, code = run(t, "", "upgrade", "apply", "--kubeconfig", kubeconfig, "--backup-dir", backups, "--measurements", newPath)
	if code == 0 || !strings.Contains(errOut, "pass --yes") {
		t.Fatalf("no answer on stdin: exit %d: %s", code, errOut)
	}
	out, _, code = run(t, "", "upgrade", "apply", "--kubeconfig", kubeconfig, "--backup-dir", backups, "--measurements", newPath, "--dry-run")
	if code != 0 || !strings.Contains(out, "Dry run: nothing was changed") {
		t.Fatalf("dry run: exit %d: %s", code, out)
	}
	if _, err := os.Stat(backups); err == nil {
		t.Error("a run that changed nothing made the backup folder")
	}
	out, _, _ = run(t, "", "upgrade", "check", "--kubeconfig", kubeconfig, "--measurements", newPath)
	if !strings.Contains(out, "which the cluster does not accept") {
		t.Errorf("check of the new image's measurements:\n%s", out)
	}
	// Several images at once, in the order given.
	oldPath, _ := writeSet(t, 1, false)
	out, errOut, code = run(t, "", "upgrade", "check", "--kubeconfig", kubeconfig, "--measurements", newPath, "--measurements", oldPath, "-o", "json")
	var r upgrade.Report
	if err := json.Unmarshal([]byte(out), &r); code != 0 || err != nil || len(r.Measurements) != 2 ||
		r.Measurements[0] != (upgrade.MeasurementsReport{Set: newSet.Name}) || r.Measurements[1] != (upgrade.MeasurementsReport{Set: initSet.Name, Accepted: true}) {
		t.Errorf("check of two images: exit %d, %+v: %s%s", code, r.Measurements, out, errOut)
	}
}

// checkControlPlaneApproval approves and revokes a control plane in the
// cluster at kubeconfig.
func checkControlPlaneApproval(t *testing.T, kubeconfig string) {
	t.Helper()
	// The approved control planes, through the real API server, in the
	// ConfigMap bootstrapperd writes at init.
	rc, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	_, err = kubernetes.NewForConfigOrDie(rc).CoreV1().ConfigMaps(controlplanes.Namespace).Create(context.Background(), &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Name: controlplanes.ConfigMapName, Namespace: controlplanes.Namespace},
		Data:       map[string]string{controlplanes.Key: "1111\n"},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if out, errOut, code := run(t, "", "control-plane", "approve", "7264511298031765023", "--kubeconfig", kubeconfig); code != 0 {
		t.Fatalf("control-plane approve: exit %d: %s%s", code, out, errOut)
	}
	out, errOut, code := run(t, "", "control-plane", "list", "--kubeconfig", kubeconfig, "-o", "jsonpath={.instanceIDs}")
	if code != 0 || !strings.Contains(out, "7264511298031765023") {
		t.Fatalf("control-plane list after approve: exit %d: %s%s", code, out, errOut)
	}
	if out, errOut, code := run(t, "", "control-plane", "revoke", "7264511298031765023", "--kubeconfig", kubeconfig); code != 0 || !strings.Contains(out, "Revoked") {
		t.Fatalf("control-plane revoke: exit %d: %s%s", code, out, errOut)
	}
	if out, _, _ := run(t, "", "control-plane", "list", "--kubeconfig", kubeconfig); strings.Contains(out, "7264511298031765023") {
		t.Fatalf("control-plane list after revoke still lists it:\n%s", out)
	}
	if _, errOut, code := run(t, "", "control-plane", "revoke", "7264511298031765023", "--kubeconfig", kubeconfig); code == 0 || !strings.Contains(errOut, "is not an approved control plane") {
		t.Fatalf("revoking it again: exit %d: %s", code, errOut)
	}
}

func TestUpgradeNeedsACluster(t *testing.T) {
	dir := t.TempDir()
	_, errOut, code := run(t, "", "upgrade", "check", "--kubeconfig", filepath.Join(dir, "missing.conf"))
	if code == 0 || !strings.Contains(errOut, "pass --kubeconfig") {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	// An API server that does not answer is named.
	conf := filepath.Join(dir, "away.conf")
	os.WriteFile(conf, []byte("apiVersion: v1\nkind: Config\nclusters: [{name: c, cluster: {server: 'https://127.0.0.1:1'}}]\ncontexts: [{name: c, context: {cluster: c, user: u}}]\nusers: [{name: u, user: {}}]\ncurrent-context: c\n"), 0o600)
	_, errOut, code = run(t, "", "upgrade", "apply", "--kubeconfig", conf, "--yes")
	if code == 0 || !strings.Contains(errOut, "does not answer") {
		t.Fatalf("exit %d: %s", code, errOut)
	}
}

// After a failed apply the owner reads where each release stands. A
// release rolled back whose old pods are still starting is rolled back,
// not "not rolled back" (as a stress run printed).
func TestApplyFailedSaysWhereReleasesStand(t *testing.T) {
	ref := func(name string) services.ReleaseRef {
		return services.ReleaseRef{Name: name, Namespace: "kube-system", Chart: name}
	}
	plan := upgrade.Plan{Steps: []upgrade.Step{
		{Ref: ref("orrery-crds"), Changes: []string{"chart"}},
		{Ref: ref("orrery-services"), Changes: []string{"chart"}},
		{Ref: ref("flannel"), Changes: []string{"chart"}},
	}}
	done := []upgrade.Outcome{{Release: "orrery-crds", Revision: 3}}
	cause := errors.New("not ready in time: DaemonSet kube-system/orrery-joinservice")
	for _, tc := range []struct {
		name string
		err  *upgrade.ReleaseError
		want string
	}{
		{"serves again", &upgrade.ReleaseError{Release: "orrery-services", RolledBackTo: 2, Err: cause},
			"orrery-services: rolled back to revision 2, which serves again"},
		{"pods still starting", &upgrade.ReleaseError{Release: "orrery-services", RolledBackTo: 2, Err: cause, NotBack: errors.New("1 of 1 pods run the new spec, 0 ready")},
			"orrery-services: rolled back to revision 2, whose pods were not all ready again within --timeout; Kubernetes goes on starting them: 1 of 1 pods run the new spec, 0 ready"},
		{"no rollback", &upgrade.ReleaseError{Release: "orrery-services", Err: cause},
			"orrery-services: not rolled back; 'helm history orrery-services -n kube-system' shows its state"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var out bytes.Buffer
			err := applyFailed(context.Background(), &out, plan, done, tc.err)
			if !errors.Is(err, tc.err) {
				t.Errorf("applyFailed returned %v, want the release's error", err)
			}
			for _, want := range []string{"orrery-crds: upgraded (revision 3)", tc.want, "flannel: not touched"} {
				if !strings.Contains(out.String(), want) {
					t.Errorf("output lacks %q:\n%s", want, out.String())
				}
			}
		})
	}
}
