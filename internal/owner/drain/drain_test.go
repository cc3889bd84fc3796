package drain

import (
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"

	"github.com/orrery-dev/orrery/internal/testkit/apiservertest"
)

func pod(name string, mutate func(*corev1.Pod)) *corev1.Pod {
	grace := int64(0)
	p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default", Labels: map[string]string{"app": name}},
		Spec: corev1.PodSpec{NodeName: "w-0", TerminationGracePeriodSeconds: &grace, Containers: []corev1.Container{{Name: "c", Image: "x"}}}}
	if mutate != nil {
		mutate(p)
	}
	return p
}

// TestDrain drains a node of a real API server (no kubelet: pods of zero
// grace go at once) with a pod of a workload, one of none, one a budget
// holds, and those a drain leaves: a DaemonSet's, a static one, a
// finished one.
func TestDrain(t *testing.T) {
	client, err := kubernetes.NewForConfig(apiservertest.Start(t).Config)
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	yes := true
	for _, p := range []*corev1.Pod{
		pod("web", func(p *corev1.Pod) {
			p.OwnerReferences = []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "ReplicaSet", Name: "web", UID: "1", Controller: &yes}}
		}),
		pod("bare", nil),
		pod("held", nil),
		pod("flannel", func(p *corev1.Pod) {
			p.OwnerReferences = []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "DaemonSet", Name: "flannel", UID: "2", Controller: &yes}}
		}),
		pod("static", func(p *corev1.Pod) { p.Annotations = map[string]string{corev1.MirrorPodAnnotationKey: "x"} }),
		pod("finished", nil),
		pod("elsewhere", func(p *corev1.Pod) { p.Spec.NodeName = "w-1" }),
	} {
		created, err := client.CoreV1().Pods("default").Create(ctx, p, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		// Running and ready, or finished, as a kubelet would say.
		created.Status = corev1.PodStatus{Phase: corev1.PodRunning, Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}}
		if p.Name == "finished" {
			created.Status = corev1.PodStatus{Phase: corev1.PodSucceeded}
		}
		if _, err := client.CoreV1().Pods("default").UpdateStatus(ctx, created, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	one := intstr.FromInt32(1)
	pdb, err := client.PolicyV1().PodDisruptionBudgets("default").Create(ctx, &policyv1.PodDisruptionBudget{ObjectMeta: metav1.ObjectMeta{Name: "held"},
		Spec: policyv1.PodDisruptionBudgetSpec{MinAvailable: &one, Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "held"}}}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	// No disruption controller runs here: the budget says what it would.
	pdb.Status = policyv1.PodDisruptionBudgetStatus{ObservedGeneration: pdb.Generation, CurrentHealthy: 1, DesiredHealthy: 1, ExpectedPods: 1}
	if _, err := client.PolicyV1().PodDisruptionBudgets("default").UpdateStatus(ctx, pdb, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}

	var said []string
	left, err := Drain(ctx, client, "w-0", 3*time.Second, func(f string, args ...any) { said = append(said, fmt.Sprintf(f, args...)) })
	if err != nil {
		t.Fatal(err)
	}
	if Names(left) != "default/held" {
		t.Errorf("left %q, want the pod the budget holds", Names(left))
	}
	pods, _ := client.CoreV1().Pods("default").List(ctx, metav1.ListOptions{})
	var names []string
	for _, p := range pods.Items {
		names = append(names, p.Name)
	}
	if got := strings.Join(names, " "); got != "elsewhere finished flannel held static" {
		t.Errorf("pods after the drain: %s", got)
	}
	all := strings.Join(said, "\n")
	if !strings.Contains(all, "default/bare, which no controller makes again") || strings.Contains(all, "default/web, which") ||
		strings.Count(all, "a PodDisruptionBudget keeps default/held") != 1 {
		t.Errorf("said:\n%s\nwant the bare pod named once, and the budget once", all)
	}
}
