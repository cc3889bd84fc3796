package upgrade

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"helm.sh/helm/v3/pkg/action"
	"helm.sh/helm/v3/pkg/chart"
	"helm.sh/helm/v3/pkg/release"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/orrery-dev/orrery/internal/attestation/measurements"
	"github.com/orrery-dev/orrery/internal/owner/charts"
	"github.com/orrery-dev/orrery/internal/owner/services"
	"github.com/orrery-dev/orrery/internal/records/measurementset"
	"github.com/orrery-dev/orrery/internal/records/orreryapi"
	"github.com/orrery-dev/orrery/internal/records/removednodes"
	"github.com/orrery-dev/orrery/internal/testkit/apiservertest"
)

var measurementSets = schema.GroupVersionResource{Group: orreryapi.Group, Version: orreryapi.Version, Resource: orreryapi.MeasurementSets}

// testCharts are Orrery's charts as a cluster without controllers can run
// them (an API server alone makes no pod ready): the real orrery-crds
// chart, the real orrery-services template of measurement sets, and a
// ConfigMap for flannel. broken adds to orrery-services a Deployment that
// can never become ready.
func testCharts(t *testing.T, version string, broken bool) func(string) (*chart.Chart, error) {
	t.Helper()
	crds, err := charts.Load(charts.OrreryCRDs)
	if err != nil {
		t.Fatal(err)
	}
	crds.Metadata.Version = version
	svc, err := charts.Load(charts.OrreryServices)
	if err != nil {
		t.Fatal(err)
	}
	svc.Metadata.Version = version
	svc.Templates = slices.DeleteFunc(svc.Templates, func(f *chart.File) bool { return f.Name != "templates/measurementsets.yaml" })
	svc.Templates = append(svc.Templates, &chart.File{Name: "templates/config.yaml", Data: []byte(
		"apiVersion: v1\nkind: ConfigMap\nmetadata: {name: orrery-test-services}\ndata: {version: \"" + version + "\"}\n")})
	if broken {
		svc.Templates = append(svc.Templates, &chart.File{Name: "templates/never-ready.yaml", Data: []byte(`apiVersion: apps/v1
kind: Deployment
metadata: {name: never-ready}
spec:
  selector: {matchLabels: {app: never-ready}}
  template:
    metadata: {labels: {app: never-ready}}
    spec: {containers: [{name: c, image: localhost/none:never}]}
`)})
	}
	flannel := &chart.Chart{Metadata: &chart.Metadata{APIVersion: "v2", Name: charts.Flannel, Version: version, Type: "application"},
		Templates: []*chart.File{{Name: "templates/config.yaml", Data: []byte("apiVersion: v1\nkind: ConfigMap\nmetadata: {name: orrery-test-flannel}\ndata: {podCIDR: {{ .Values.podCIDR | quote }}}\n")}}}
	byName := map[string]*chart.Chart{charts.OrreryCRDs: crds, charts.OrreryServices: svc, charts.Flannel: flannel}
	return func(name string) (*chart.Chart, error) {
		c, ok := byName[name]
		if !ok {
			return nil, errors.New("no test chart " + name)
		}
		return c, nil
	}
}

func testSet(t *testing.T, b byte) measurementset.Set {
	t.Helper()
	s, err := measurementset.New(measurements.M{4: {Expected: bytes.Repeat([]byte{b}, 32)}, 11: {Expected: bytes.Repeat([]byte{b + 1}, 32)}}, "")
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// initCluster installs the releases as 'orrery init' would, with the test
// charts of version.
func initCluster(t *testing.T, version string, set measurementset.Set) *Cluster {
	t.Helper()
	srv := apiservertest.Start(t)
	c, err := Connect(context.Background(), srv.Kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	load := testCharts(t, version, false)
	v, err := set.Values()
	if err != nil {
		t.Fatal(err)
	}
	values := map[string]map[string]any{
		charts.OrreryCRDs:     {},
		charts.Flannel:        {"podCIDR": "10.244.0.0/16"},
		charts.OrreryServices: {"measurementSets": []any{v}, "endpoint": "10.42.1.100:6443"},
	}
	for _, ref := range services.Owned {
		ch, _ := load(ref.Chart)
		hc, err := c.Helm(ref.Namespace)
		if err != nil {
			t.Fatal(err)
		}
		in := action.NewInstall(hc)
		in.ReleaseName, in.Namespace, in.Wait, in.Timeout = ref.Name, ref.Namespace, true, time.Minute
		in.Description = services.Description("init")
		if _, err := in.Run(ch, values[ref.Chart]); err != nil {
			t.Fatalf("install %s: %v", ref.Name, err)
		}
	}
	return c
}

func plan(t *testing.T, c *Cluster, load func(string) (*chart.Chart, error), opts Options) Plan {
	t.Helper()
	installed, err := c.Read()
	if err != nil {
		t.Fatal(err)
	}
	p, err := MakePlan(installed, load, opts)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func history(t *testing.T, c *Cluster, name string) []*release.Release {
	t.Helper()
	hc, err := c.Helm(services.Namespace)
	if err != nil {
		t.Fatal(err)
	}
	revs, err := action.NewHistory(hc).Run(name)
	if err != nil {
		t.Fatal(err)
	}
	slices.SortFunc(revs, func(a, b *release.Release) int { return a.Version - b.Version })
	return revs
}

func setNames(t *testing.T, c *Cluster) []string {
	t.Helper()
	list, err := c.Dynamic.Resource(measurementSets).List(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, it := range list.Items {
		out = append(out, it.GetName())
	}
	slices.Sort(out)
	return out
}

// An upgrade to newer charts with a second image: backed up first,
// every release upgraded in order, the sets in the cluster follow, and
// a second run changes nothing.
func TestUpgradeAndRollover(t *testing.T) {
	ctx := context.Background()
	oldSet, newSet := testSet(t, 1), testSet(t, 7)
	// As a cluster initialised before init made the removed-node list.
	c := initCluster(t, "0.2.0", oldSet)
	removedList := func() error {
		_, err := c.Kube.CoreV1().ConfigMaps(removednodes.Namespace).Get(ctx, removednodes.ConfigMapName, metav1.GetOptions{})
		return err
	}
	if err := removedList(); !apierrors.IsNotFound(err) {
		t.Fatalf("the removed-node list before the upgrade: %v, want none", err)
	}
	if got := setNames(t, c); !slices.Equal(got, []string{oldSet.Name}) {
		t.Fatalf("sets after init %v", got)
	}

	load := testCharts(t, "0.2.1", false)
	p := plan(t, c, load, Options{Add: []measurementset.Set{newSet}})
	var changes []string
	for _, s := range p.Steps {
		changes = append(changes, s.Ref.Name+": "+strings.Join(s.Changes, "; "))
	}
	want := []string{"orrery-crds: chart 0.2.0 -> 0.2.1", "flannel: chart 0.2.0 -> 0.2.1", "orrery-services: chart 0.2.0 -> 0.2.1; accept image " + newSet.Name}
	if !slices.Equal(changes, want) {
		t.Fatalf("plan\n%s\nwant\n%s", strings.Join(changes, "\n"), strings.Join(want, "\n"))
	}

	var log []string
	dir := filepath.Join(t.TempDir(), "orrery-backups", "now")
	saved, outcomes, err := Apply(ctx, ApplyConfig{Helm: c.Helm, Client: c.Dynamic, Kube: c.Kube, BackupDir: dir, Timeout: time.Minute,
		Progress: func(m string) { log = append(log, m) }}, p)
	if err != nil {
		t.Fatalf("apply: %v\n%s", err, strings.Join(log, "\n"))
	}
	if len(outcomes) != 3 || outcomes[0].Release != "orrery-crds" || outcomes[2].Release != "orrery-services" || outcomes[2].Revision != 2 {
		t.Fatalf("outcomes %+v", outcomes)
	}
	// The backup holds both definitions and the set that existed before.
	if saved.CRDs != 2 || saved.Resources != 1 {
		t.Errorf("backup of %d CRDs and %d resources, want 2 and 1", saved.CRDs, saved.Resources)
	}
	if _, err := os.Stat(filepath.Join(dir, "resources", "measurementsets.orrery.dev", "_cluster", oldSet.Name+".yaml")); err != nil {
		t.Errorf("the backup lacks the measurement set: %v", err)
	}
	if err := removedList(); err != nil {
		t.Errorf("the upgrade did not make the removed-node list: %v", err)
	}
	if got, want := setNames(t, c), []string{oldSet.Name, newSet.Name}; !slices.Equal(got, sortedCopy(want)) {
		t.Errorf("sets after the rollover %v, want %v", got, want)
	}
	revs := history(t, c, "orrery-services")
	if len(revs) != 2 || revs[1].Info.Status != release.StatusDeployed || !strings.HasPrefix(revs[1].Info.Description, "orrery upgrade") {
		t.Errorf("helm history of orrery-services: %d revisions, last %v", len(revs), revs[len(revs)-1].Info)
	}

	// Idempotent: nothing to do, and Apply does nothing (no backup).
	again := plan(t, c, load, Options{Add: []measurementset.Set{newSet}})
	if again.Changes() {
		t.Fatalf("a second run would change %+v", again.Steps)
	}
	dir2 := filepath.Join(t.TempDir(), "second")
	if _, out, err := Apply(ctx, ApplyConfig{Helm: c.Helm, Client: c.Dynamic, Kube: c.Kube, BackupDir: dir2, Timeout: time.Minute}, again); err != nil || len(out) != 0 {
		t.Fatalf("apply of an empty plan: %v, %v", out, err)
	}
	if _, err := os.Stat(dir2); err == nil {
		t.Error("an apply that changed nothing wrote a backup")
	}

	// Retire the old image: only orrery-services changes. No Timeout:
	// the default applies, not a zero wait that rolls everything back.
	retire := plan(t, c, load, Options{Retire: []string{oldSet.Name}})
	if _, _, err := Apply(ctx, ApplyConfig{Helm: c.Helm, Client: c.Dynamic, Kube: c.Kube, BackupDir: filepath.Join(t.TempDir(), "third")}, retire); err != nil {
		t.Fatal(err)
	}
	if got := setNames(t, c); !slices.Equal(got, []string{newSet.Name}) {
		t.Errorf("sets after retiring %v", got)
	}
}

func sortedCopy(s []string) []string {
	out := slices.Clone(s)
	slices.Sort(out)
	return out
}

// A release whose pods never become ready is rolled back by itself, the
// old revision serves again, and the releases after it are not touched.
func TestFailedReleaseRollsBack(t *testing.T) {
	ctx := context.Background()
	c := initCluster(t, "0.2.0", testSet(t, 1))
	p := plan(t, c, testCharts(t, "0.2.1", true), Options{})
	start := time.Now()
	const timeout = 5 * time.Second
	_, outcomes, err := Apply(ctx, ApplyConfig{Helm: c.Helm, Client: c.Dynamic, Kube: c.Kube, BackupDir: filepath.Join(t.TempDir(), "b"), Timeout: timeout}, p)
	re, ok := IsReleaseError(err)
	if !ok || re.Release != "orrery-services" || re.RolledBackTo != 1 {
		t.Fatalf("err = %v, want orrery-services rolled back to revision 1", err)
	}
	if took := time.Since(start); took > timeout+time.Minute {
		t.Errorf("the rollback took %s, more than the timeout plus a minute", took)
	}
	if len(outcomes) != 2 {
		t.Errorf("outcomes %+v, want the two releases before orrery-services", outcomes)
	}
	revs := history(t, c, "orrery-services")
	last := revs[len(revs)-1]
	if last.Info.Status != release.StatusDeployed || last.Chart.Metadata.Version != "0.2.0" {
		t.Errorf("orrery-services serves revision %d (%s, chart %s), want a copy of revision 1", last.Version, last.Info.Status, last.Chart.Metadata.Version)
	}
	if _, err := c.Dynamic.Resource(schema.GroupVersionResource{Group: "apps", Version: "v1", Resource: "deployments"}).Namespace(services.Namespace).Get(ctx, "never-ready", metav1.GetOptions{}); err == nil {
		t.Error("the failed revision's Deployment is still there")
	}
}

// Ctrl-C during a release's upgrade leaves no half-applied release: Helm
// rolls it back before Apply returns.
func TestInterruptRollsBack(t *testing.T) {
	c := initCluster(t, "0.2.0", testSet(t, 1))
	p := plan(t, c, testCharts(t, "0.2.1", true), Options{})
	ctx, cancel := context.WithCancel(context.Background())
	_, _, err := Apply(ctx, ApplyConfig{Helm: c.Helm, Client: c.Dynamic, Kube: c.Kube, BackupDir: filepath.Join(t.TempDir(), "b"), Timeout: 10 * time.Minute,
		Progress: func(m string) {
			if strings.HasPrefix(m, "upgrading orrery-services") {
				time.AfterFunc(2*time.Second, cancel)
			}
		}}, p)
	if err == nil {
		t.Fatal("an interrupted upgrade succeeded")
	}
	last := history(t, c, "orrery-services")
	if s := last[len(last)-1].Info.Status; s != release.StatusDeployed || last[len(last)-1].Chart.Metadata.Version != "0.2.0" {
		t.Fatalf("after the interrupt orrery-services is %s with chart %s, want the old revision deployed (err: %v)", s, last[len(last)-1].Chart.Metadata.Version, err)
	}
}

// A release changed with the helm CLI since Orrery's last revision is
// refused, with what differs, unless forced.
func TestHandChangedReleaseRefused(t *testing.T) {
	c := initCluster(t, "0.2.0", testSet(t, 1))
	hc, err := c.Helm(services.Namespace)
	if err != nil {
		t.Fatal(err)
	}
	load := testCharts(t, "0.2.0", false)
	ch, _ := load(charts.Flannel)
	up := action.NewUpgrade(hc)
	up.Namespace = services.Namespace
	if _, err := up.Run("flannel", ch, map[string]any{"podCIDR": "10.99.0.0/16"}); err != nil {
		t.Fatal(err)
	}
	installed, err := c.Read()
	if err != nil {
		t.Fatal(err)
	}
	_, err = MakePlan(installed, testCharts(t, "0.2.1", false), Options{})
	if err == nil || !strings.Contains(err.Error(), "flannel was changed outside Orrery") || !strings.Contains(err.Error(), "values differ at podCIDR") {
		t.Fatalf("err = %v, want the hand change named", err)
	}
	p, err := MakePlan(installed, testCharts(t, "0.2.1", false), Options{Force: true})
	if err != nil || len(p.Notes) != 1 {
		t.Fatalf("--force: %v, notes %v", err, p.Notes)
	}
}

// A backup that cannot be written stops the upgrade before any release.
func TestBackupFailureChangesNothing(t *testing.T) {
	c := initCluster(t, "0.2.0", testSet(t, 1))
	p := plan(t, c, testCharts(t, "0.2.1", false), Options{})
	file := filepath.Join(t.TempDir(), "a-file")
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	_, outcomes, err := Apply(context.Background(), ApplyConfig{Helm: c.Helm, Client: c.Dynamic, Kube: c.Kube, BackupDir: filepath.Join(file, "backup"), Timeout: time.Minute}, p)
	if err == nil || len(outcomes) != 0 || !strings.Contains(err.Error(), "nothing was upgraded") {
		t.Fatalf("outcomes %v, err %v", outcomes, err)
	}
	for _, ref := range services.Owned {
		if n := len(history(t, c, ref.Name)); n != 1 {
			t.Errorf("%s has %d revisions after a failed backup", ref.Name, n)
		}
	}
}
