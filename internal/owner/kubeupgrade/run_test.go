package kubeupgrade

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"

	"github.com/orrery-dev/orrery/internal/etcd"
	"github.com/orrery-dev/orrery/internal/owner/drain"
	"github.com/orrery-dev/orrery/internal/records/kubeadmconfig"
	"github.com/orrery-dev/orrery/internal/testkit/apiservertest"
)

// cluster is a real API server holding the objects of a cluster at v36:
// control plane cp-0 with its components' mirror pods, workers w-0 and
// w-1, and pods on w-0 of a workload, a DaemonSet and a static pod.
func cluster(t *testing.T) kubernetes.Interface {
	t.Helper()
	client, err := kubernetes.NewForConfig(apiservertest.Start(t).Config)
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	must := func(_ any, err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(client.CoreV1().ConfigMaps(kubeadmconfig.Namespace).Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: kubeadmconfig.ConfigMapName},
		Data: map[string]string{"ClusterConfiguration": "kind: ClusterConfiguration\nkubernetesVersion: " + v36 + "\n"}}, metav1.CreateOptions{}))
	for i, name := range []string{"cp-0", "w-0", "w-1"} {
		n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{}}}
		if name == "cp-0" {
			n.Labels[controlPlaneLabel] = ""
		}
		n, err := client.CoreV1().Nodes().Create(ctx, n, metav1.CreateOptions{})
		must(n, err)
		n.Status = corev1.NodeStatus{NodeInfo: corev1.NodeSystemInfo{KubeletVersion: v36},
			Conditions: []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue}},
			Addresses:  []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: fmt.Sprintf("10.42.1.%d", 100+i)}}}
		must(client.CoreV1().Nodes().UpdateStatus(ctx, n, metav1.UpdateOptions{}))
	}
	for _, c := range Components {
		p := pod(c+"-cp-0", "cp-0", map[string]string{"tier": "control-plane", "component": c}, "registry.k8s.io/"+c+":"+v36)
		p.Annotations = map[string]string{corev1.MirrorPodAnnotationKey: "x"}
		must(client.CoreV1().Pods(metav1.NamespaceSystem).Create(ctx, p, metav1.CreateOptions{}))
	}
	web, err := client.CoreV1().Pods("default").Create(ctx, pod("web", "w-0", map[string]string{"app": "web"}, "web"), metav1.CreateOptions{})
	must(web, err)
	// Running and ready, as its kubelet would say: a budget guards only
	// such pods.
	web.Status = corev1.PodStatus{Phase: corev1.PodRunning, Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}}
	must(client.CoreV1().Pods("default").UpdateStatus(ctx, web, metav1.UpdateOptions{}))
	ds := pod("flannel-x", "w-0", nil, "flannel")
	ds.OwnerReferences = []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "DaemonSet", Name: "flannel", UID: "1", Controller: ptr(true)}}
	must(client.CoreV1().Pods("default").Create(ctx, ds, metav1.CreateOptions{}))
	static := pod("static-w-0", "w-0", nil, "static")
	static.Annotations = map[string]string{corev1.MirrorPodAnnotationKey: "x"}
	must(client.CoreV1().Pods("default").Create(ctx, static, metav1.CreateOptions{}))
	return client
}

func ptr[T any](v T) *T { return &v }

func pod(name, node string, labels map[string]string, image string) *corev1.Pod {
	return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels},
		Spec: corev1.PodSpec{NodeName: node, TerminationGracePeriodSeconds: ptr(int64(0)),
			Containers: []corev1.Container{{Name: "c", Image: image}}}}
}

// fakeNode upgrades a node by what its kubelet and kubeadm would change
// in the API: the Node's kubelet version, a control plane's pods. It
// records what it saw of the cluster when asked.
type fakeNodes struct {
	t      *testing.T
	client kubernetes.Interface
	mu     sync.Mutex
	log    []string
	fail   map[string]error
	etcd   []byte
}

type fakeNode struct {
	f *fakeNodes
	n Node
}

func (f *fakeNodes) connect(_ context.Context, n Node) (NodeClient, error) {
	return fakeNode{f, n}, nil
}

func (c fakeNode) Close() error { return nil }

func (c fakeNode) BackupEtcd(_ context.Context, w io.Writer) error {
	_, err := w.Write(c.f.etcd)
	return err
}

func (c fakeNode) Upgrade(ctx context.Context, version string, apply bool, line func(string)) error {
	f, client := c.f, c.f.client
	node, err := client.CoreV1().Nodes().Get(ctx, c.n.Name, metav1.GetOptions{})
	if err != nil {
		return err
	}
	pods, _ := drain.Pods(ctx, client, c.n.Name)
	entry := fmt.Sprintf("%s apply=%t cordoned=%t pods=%d", c.n.Name, apply, node.Spec.Unschedulable, len(pods))
	f.mu.Lock()
	f.log = append(f.log, entry)
	err = f.fail[c.n.Name]
	delete(f.fail, c.n.Name)
	f.mu.Unlock()
	line("[upgrade] " + c.n.Name)
	if err != nil {
		return err
	}
	if apply {
		cm, _ := client.CoreV1().ConfigMaps(kubeadmconfig.Namespace).Get(ctx, kubeadmconfig.ConfigMapName, metav1.GetOptions{})
		cm.Data["ClusterConfiguration"] = "kind: ClusterConfiguration\nkubernetesVersion: " + version + "\n"
		if _, err := client.CoreV1().ConfigMaps(kubeadmconfig.Namespace).Update(ctx, cm, metav1.UpdateOptions{}); err != nil {
			return err
		}
	}
	if c.n.ControlPlane {
		for _, comp := range Components {
			p, _ := client.CoreV1().Pods(metav1.NamespaceSystem).Get(ctx, comp+"-"+c.n.Name, metav1.GetOptions{})
			p.Spec.Containers[0].Image = "registry.k8s.io/" + comp + ":" + version
			if _, err := client.CoreV1().Pods(metav1.NamespaceSystem).Update(ctx, p, metav1.UpdateOptions{}); err != nil {
				return err
			}
		}
	}
	node.Status.NodeInfo.KubeletVersion = version
	_, err = client.CoreV1().Nodes().UpdateStatus(ctx, node, metav1.UpdateOptions{})
	return err
}

func (f *fakeNodes) calls() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.log...)
}

func newRun(t *testing.T) (Config, *fakeNodes, *bytes.Buffer) {
	client := cluster(t)
	f := &fakeNodes{t: t, client: client, fail: map[string]error{}}
	var out bytes.Buffer
	var mu sync.Mutex
	return Config{Client: client, Connect: f.connect, Say: func(format string, args ...any) {
		mu.Lock()
		defer mu.Unlock()
		fmt.Fprintf(&out, format+"\n", args...)
	}, NodeTimeout: time.Minute, DrainTimeout: 10 * time.Second, ReadyTimeout: 10 * time.Second}, f, &out
}

func plan(t *testing.T, c Config) Plan {
	t.Helper()
	s, err := Read(t.Context(), c.Client)
	if err != nil {
		t.Fatal(err)
	}
	p, err := MakePlan(s, v37, carriedByAll(s, v36, v37))
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func TestRunUpgradesControlPlanesThenDrainedWorkers(t *testing.T) {
	c, f, out := newRun(t)
	if err := Run(t.Context(), c, plan(t, c)); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	want := "cp-0 apply=true cordoned=false pods=0 | w-0 apply=false cordoned=true pods=0 | w-1 apply=false cordoned=true pods=0"
	if got := strings.Join(f.calls(), " | "); got != want {
		t.Errorf("upgrades:\n%s\nwant\n%s", got, want)
	}
	left, _ := c.Client.CoreV1().Pods("default").List(t.Context(), metav1.ListOptions{})
	var names []string
	for _, p := range left.Items {
		names = append(names, p.Name)
	}
	if strings.Join(names, " ") != "flannel-x static-w-0" {
		t.Errorf("pods left on the drained node: %v, want the DaemonSet's and the static one", names)
	}
	for _, n := range []string{"w-0", "w-1"} {
		node, _ := c.Client.CoreV1().Nodes().Get(t.Context(), n, metav1.GetOptions{})
		if node.Spec.Unschedulable || node.Annotations[CordonedAnnotation] != "" {
			t.Errorf("%s is still cordoned after its upgrade", n)
		}
	}
	if p := plan(t, c); len(p.Pending()) != 0 {
		t.Errorf("after the upgrade, %d steps are pending", len(p.Pending()))
	}
	if !strings.Contains(out.String(), "w-1: runs Kubernetes "+v37+", upgraded in") || !regexp.MustCompile(`\n   0:\d\d \| \[upgrade\] cp-0`).MatchString(out.String()) {
		t.Errorf("progress:\n%s", out)
	}
}

// A node that fails is named and left serving; the nodes after it are
// not touched, and the same upgrade run again goes on from it.
func TestRunStopsAtAFailedNodeAndGoesOnWhenRunAgain(t *testing.T) {
	c, f, out := newRun(t)
	f.fail["w-0"] = status.Error(codes.Aborted, "kubeadm upgrade node to "+v37+" failed; this node still runs "+v36)
	err := Run(t.Context(), c, plan(t, c))
	var ne *NodeError
	if !errors.As(err, &ne) || ne.Node != "w-0" || ne.MayRun || !strings.Contains(err.Error(), "node w-0 was not upgraded from "+v36) {
		t.Fatalf("Run = %v, want a NodeError for w-0", err)
	}
	node, _ := c.Client.CoreV1().Nodes().Get(t.Context(), "w-0", metav1.GetOptions{})
	if node.Spec.Unschedulable {
		t.Error("the failed node was left cordoned")
	}
	if err := Run(t.Context(), c, plan(t, c)); err != nil {
		t.Fatalf("again: %v\n%s", err, out)
	}
	want := "cp-0 apply=true cordoned=false pods=0 | w-0 apply=false cordoned=true pods=0 | w-0 apply=false cordoned=true pods=0 | w-1 apply=false cordoned=true pods=0"
	if got := strings.Join(f.calls(), " | "); got != want {
		t.Errorf("upgrades:\n%s\nwant\n%s", got, want)
	}
}

// A worker whose upgrade the owner lost (the connection cut, the
// node's deadline passed) may be upgrading still: it is not uncordoned,
// and the error says so, not that the node runs its old release.
func TestALostUpgradeLeavesItsWorkerCordoned(t *testing.T) {
	for name, fail := range map[string]error{
		"connection cut": status.Error(codes.Unavailable, "error reading from server: EOF"),
		"deadline":       status.Error(codes.DeadlineExceeded, "context deadline exceeded"),
		"no status":      io.ErrUnexpectedEOF,
	} {
		t.Run(name, func(t *testing.T) {
			c, f, _ := newRun(t)
			f.fail["w-0"] = fail
			err := Run(t.Context(), c, plan(t, c))
			var ne *NodeError
			if !errors.As(err, &ne) || ne.Node != "w-0" || !ne.MayRun || !strings.Contains(err.Error(), "may still be running") {
				t.Fatalf("Run = %v, want a NodeError for w-0 that says its upgrade may still run", err)
			}
			node, _ := c.Client.CoreV1().Nodes().Get(t.Context(), "w-0", metav1.GetOptions{})
			if !node.Spec.Unschedulable || node.Annotations[CordonedAnnotation] != v37 {
				t.Errorf("w-0: unschedulable %v, annotations %v; want it cordoned and marked", node.Spec.Unschedulable, node.Annotations)
			}
		})
	}
}

func TestRunLeavesTheOwnersCordon(t *testing.T) {
	c, _, out := newRun(t)
	node, _ := c.Client.CoreV1().Nodes().Get(t.Context(), "w-1", metav1.GetOptions{})
	node.Spec.Unschedulable = true
	if _, err := c.Client.CoreV1().Nodes().Update(t.Context(), node, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := Run(t.Context(), c, plan(t, c)); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	node, _ = c.Client.CoreV1().Nodes().Get(t.Context(), "w-1", metav1.GetOptions{})
	if !node.Spec.Unschedulable {
		t.Error("the upgrade uncordoned a node the owner had cordoned")
	}
}

func TestADisruptionBudgetThatForbidsTheDrainStopsTheUpgrade(t *testing.T) {
	c, f, _ := newRun(t)
	c.DrainTimeout = 3 * time.Second
	_, err := c.Client.PolicyV1().PodDisruptionBudgets("default").Create(t.Context(), &policyv1.PodDisruptionBudget{
		ObjectMeta: metav1.ObjectMeta{Name: "web"},
		Spec: policyv1.PodDisruptionBudgetSpec{MinAvailable: ptr(intstr.FromInt32(1)),
			Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "web"}}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	// The disruption controller is not running here: the budget says
	// what it would.
	pdb, _ := c.Client.PolicyV1().PodDisruptionBudgets("default").Get(t.Context(), "web", metav1.GetOptions{})
	pdb.Status = policyv1.PodDisruptionBudgetStatus{ObservedGeneration: pdb.Generation, DisruptionsAllowed: 0, CurrentHealthy: 1, DesiredHealthy: 1, ExpectedPods: 1}
	if _, err := c.Client.PolicyV1().PodDisruptionBudgets("default").UpdateStatus(t.Context(), pdb, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	err = Run(t.Context(), c, plan(t, c))
	var ne *NodeError
	if !errors.As(err, &ne) || ne.Node != "w-0" || !strings.Contains(err.Error(), "default/web still there") {
		t.Fatalf("Run = %v, want w-0's drain to fail naming default/web", err)
	}
	if got := f.calls(); len(got) != 1 {
		t.Errorf("upgrades %q, want the control plane's alone", got)
	}
	node, _ := c.Client.CoreV1().Nodes().Get(t.Context(), "w-0", metav1.GetOptions{})
	if node.Spec.Unschedulable {
		t.Error("the node whose drain failed was left cordoned")
	}
}

func TestBackupEtcd(t *testing.T) {
	db := bytes.Repeat([]byte("page"), 4096)
	sum := sha256.Sum256(db)
	dir := t.TempDir()
	for name, c := range map[string]struct {
		stream []byte
		want   error
	}{
		"whole":     {append(append([]byte{}, db...), sum[:]...), nil},
		"cut short": {db[:1000], etcd.ErrCorrupt},
	} {
		t.Run(name, func(t *testing.T) {
			f := &fakeNodes{etcd: c.stream}
			path := filepath.Join(dir, name, "etcd-snapshot.db")
			size, err := BackupEtcd(t.Context(), Config{Connect: f.connect}, Node{Name: "cp-0", ControlPlane: true}, path)
			if !errors.Is(err, c.want) {
				t.Fatalf("BackupEtcd = %v, want %v", err, c.want)
			}
			fi, statErr := os.Stat(path)
			if c.want != nil {
				if statErr == nil {
					t.Error("a failed backup left its file")
				}
				return
			}
			if statErr != nil || fi.Mode().Perm() != 0o600 || size != int64(len(c.stream)) || fi.Size() != size {
				t.Errorf("backup %v, mode %v, size %d; want 0600 and %d bytes", statErr, fi.Mode(), size, len(c.stream))
			}
		})
	}
}

// A worker whose upgrade the owner interrupts may be upgrading still: it
// stays cordoned, marked, and the next run finishes it and uncordons it.
func TestAnInterruptedWorkerStaysCordonedUntilTheNextRun(t *testing.T) {
	c, _, out := newRun(t)
	ctx, cancel := context.WithCancel(t.Context())
	connect := c.Connect
	c.Connect = func(cctx context.Context, n Node) (NodeClient, error) {
		if n.Name == "w-0" {
			cancel() // Ctrl-C while w-0 upgrades
		}
		return connect(cctx, n)
	}
	if err := Run(ctx, c, plan(t, c)); err == nil {
		t.Fatal("an interrupted upgrade returned nil")
	}
	node, _ := c.Client.CoreV1().Nodes().Get(t.Context(), "w-0", metav1.GetOptions{})
	if !node.Spec.Unschedulable || node.Annotations[CordonedAnnotation] != v37 {
		t.Fatalf("the interrupted worker: unschedulable %v, annotations %v; want it cordoned and marked", node.Spec.Unschedulable, node.Annotations)
	}
	c.Connect = connect
	if err := Run(t.Context(), c, plan(t, c)); err != nil {
		t.Fatalf("the next run: %v\n%s", err, out)
	}
	node, _ = c.Client.CoreV1().Nodes().Get(t.Context(), "w-0", metav1.GetOptions{})
	if node.Spec.Unschedulable || node.Annotations[CordonedAnnotation] != "" {
		t.Errorf("after the next run, w-0 is still cordoned or marked: %v", node.Annotations)
	}
}
