package upgrade

import (
	"context"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"helm.sh/helm/v3/pkg/action"
	"helm.sh/helm/v3/pkg/chart"
	"helm.sh/helm/v3/pkg/release"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/dynamic"

	"github.com/orrery-dev/orrery/internal/owner/services"
	"github.com/orrery-dev/orrery/internal/testkit/apiservertest"
)

// agentChart is a release with one DaemonSet running image.
func agentChart(version, image string) *chart.Chart {
	return &chart.Chart{Metadata: &chart.Metadata{APIVersion: "v2", Name: "agent", Version: version, Type: "application"},
		Templates: []*chart.File{{Name: "templates/ds.yaml", Data: []byte(`apiVersion: apps/v1
kind: DaemonSet
metadata: {name: agent, namespace: {{ .Release.Namespace }}}
spec:
  selector: {matchLabels: {app: agent}}
  template:
    metadata: {labels: {app: agent}}
    spec: {containers: [{name: c, image: ` + image + `}]}
`)}}}
}

// daemonSetController plays the DaemonSet controller of a one-node cluster
// until the test ends: each new spec gets its pod at once, which becomes
// ready unless its image is one of neverReady.
func daemonSetController(t *testing.T, client dynamic.Interface, neverReady ...string) {
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	ds := client.Resource(Workload{Kind: "DaemonSet"}.resource()).Namespace(services.Namespace)
	go func() {
		for ctx.Err() == nil {
			time.Sleep(100 * time.Millisecond)
			obj, err := ds.Get(ctx, "agent", metav1.GetOptions{})
			if err != nil {
				continue
			}
			if gen, _, _ := unstructured.NestedInt64(obj.Object, "status", "observedGeneration"); gen == obj.GetGeneration() {
				continue
			}
			containers, _, _ := unstructured.NestedSlice(obj.Object, "spec", "template", "spec", "containers")
			ready := int64(1)
			if image, _, _ := unstructured.NestedString(containers[0].(map[string]any), "image"); slices.Contains(neverReady, image) {
				ready = 0
			}
			unstructured.SetNestedMap(obj.Object, map[string]any{
				"observedGeneration": obj.GetGeneration(), "desiredNumberScheduled": int64(1), "currentNumberScheduled": int64(1),
				"updatedNumberScheduled": int64(1), "numberReady": ready, "numberAvailable": ready, "numberUnavailable": 1 - ready,
				"numberMisscheduled": int64(0),
			}, "status")
			if _, err := ds.UpdateStatus(ctx, obj, metav1.UpdateOptions{}); err != nil {
				t.Logf("update status: %v", err)
			}
		}
	}()
}

// Helm's wait passes a DaemonSet whose only pod runs the new spec but is
// not ready (maxUnavailable 1 covers it): on a one-control-plane cluster
// a join service that could never start was reported upgraded. The
// upgrade must not count until every pod of the new spec is ready, and is
// rolled back when that does not happen in time.
func TestDaemonSetNeverReadyRollsBack(t *testing.T) {
	srv := apiservertest.Start(t)
	c, err := Connect(context.Background(), srv.Kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	const broken = "localhost/agent:does-not-exist"
	daemonSetController(t, c.Dynamic, broken)
	hc, err := c.Helm(services.Namespace)
	if err != nil {
		t.Fatal(err)
	}
	in := action.NewInstall(hc)
	in.ReleaseName, in.Namespace, in.Wait, in.Timeout = "agent", services.Namespace, true, time.Minute
	if _, err := in.Run(agentChart("1.0.0", "localhost/agent:1"), nil); err != nil {
		t.Fatalf("install: %v", err)
	}
	var said []string
	upgradeTo := func(image string) error {
		ch := agentChart("1.0.1", image)
		step := Step{Ref: services.ReleaseRef{Name: "agent", Namespace: services.Namespace, Chart: "agent"},
			FromRevision: history(t, c, "agent")[len(history(t, c, "agent"))-1].Version, Chart: ch, Changes: []string{"image"}}
		_, _, err := Apply(context.Background(), ApplyConfig{Helm: c.Helm, Client: c.Dynamic, Kube: c.Kube, BackupDir: filepath.Join(t.TempDir(), "b"),
			CRDs: []string{}, Timeout: 5 * time.Second, Progress: func(m string) { said = append(said, m) }}, Plan{Steps: []Step{step}})
		return err
	}

	start := time.Now()
	err = upgradeTo(broken)
	// Where a failed upgrade's time went is on the owner's screen.
	for _, want := range []string{"agent: revision 2 deployed by Helm after", "agent: its pods were not all ready", "agent: Helm took it back to revision 1 in"} {
		if !slices.ContainsFunc(said, func(m string) bool { return strings.HasPrefix(m, want) }) {
			t.Errorf("progress %q lacks a line starting %q", said, want)
		}
	}
	re, ok := IsReleaseError(err)
	if !ok || re.RolledBackTo != 1 || !strings.Contains(err.Error(), "DaemonSet kube-system/agent: 1 of 1 pods run the new spec, 0 ready") {
		t.Fatalf("err = %v, want agent rolled back to revision 1, naming the DaemonSet that is not ready", err)
	}
	if took := time.Since(start); took > 5*time.Second+time.Minute {
		t.Errorf("the rollback took %s, more than the timeout and a minute", took)
	}
	revs := history(t, c, "agent")
	last := revs[len(revs)-1]
	if last.Info.Status != release.StatusDeployed || !strings.Contains(last.Manifest, "localhost/agent:1") {
		t.Errorf("agent serves revision %d (%s), want a copy of revision 1", last.Version, last.Info.Status)
	}

	if err := upgradeTo("localhost/agent:2"); err != nil {
		t.Fatalf("an upgrade whose pod gets ready: %v", err)
	}
}

// On a loaded machine the rolled-back revision's pods may take longer than
// the timeout to be ready again (a stress run's join service did). The
// release is rolled back all the same, and the error says both: the
// revision it serves, and that its pods are still starting.
func TestRollbackWhosePodsAreSlowIsStillARollback(t *testing.T) {
	srv := apiservertest.Start(t)
	c, err := Connect(context.Background(), srv.Kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	const slow, broken = "localhost/agent:slow", "localhost/agent:does-not-exist"
	daemonSetController(t, c.Dynamic, slow, broken)
	hc, err := c.Helm(services.Namespace)
	if err != nil {
		t.Fatal(err)
	}
	// Revision 1's pod is not ready, as a pod still starting is not.
	in := action.NewInstall(hc)
	in.ReleaseName, in.Namespace = "agent", services.Namespace
	if _, err := in.Run(agentChart("1.0.0", slow), nil); err != nil {
		t.Fatalf("install: %v", err)
	}
	step := Step{Ref: services.ReleaseRef{Name: "agent", Namespace: services.Namespace, Chart: "agent"},
		FromRevision: 1, Chart: agentChart("1.0.1", broken), Changes: []string{"image"}}
	_, _, err = Apply(context.Background(), ApplyConfig{Helm: c.Helm, Client: c.Dynamic, Kube: c.Kube, BackupDir: filepath.Join(t.TempDir(), "b"),
		CRDs: []string{}, Timeout: 5 * time.Second}, Plan{Steps: []Step{step}})
	re, ok := IsReleaseError(err)
	if !ok || re.RolledBackTo != 1 || re.NotBack == nil {
		t.Fatalf("err = %#v, want agent rolled back to revision 1 with its pods not back", err)
	}
	for _, want := range []string{"rolled back to revision 1, whose pods are not back yet", "DaemonSet kube-system/agent: 1 of 1 pods run the new spec, 0 ready"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q lacks %q", err, want)
		}
	}
	revs := history(t, c, "agent")
	if last := revs[len(revs)-1]; last.Info.Status != release.StatusDeployed || !strings.Contains(last.Manifest, slow) {
		t.Errorf("agent serves revision %d (%s), want a copy of revision 1", last.Version, last.Info.Status)
	}
}
