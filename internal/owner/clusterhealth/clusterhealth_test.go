package clusterhealth

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
)

func controlPlanePod(component string, ready bool, restarts int32) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: component + "-cp-0", Namespace: "kube-system",
			Labels: map[string]string{"tier": "control-plane", "component": component}},
		Spec: corev1.PodSpec{NodeName: "cp-0"},
		Status: corev1.PodStatus{ContainerStatuses: []corev1.ContainerStatus{{
			Name: component, Ready: ready, RestartCount: restarts,
			LastTerminationState: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: 137, Reason: "Error"}},
		}}},
	}
}

func coreDNS(available int32) *appsv1.Deployment {
	two := int32(2)
	return &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Name: "coredns", Namespace: "kube-system"},
		Spec: appsv1.DeploymentSpec{Replicas: &two}, Status: appsv1.DeploymentStatus{AvailableReplicas: available}}
}

// flannel is the pod network's DaemonSet and its pods, ready or not, by
// node name.
func flannel(pods map[string]bool) []runtime.Object {
	labels := map[string]string{"app": "flannel"}
	objs := []runtime.Object{&appsv1.DaemonSet{ObjectMeta: metav1.ObjectMeta{Name: "flannel", Namespace: "kube-system"},
		Spec: appsv1.DaemonSetSpec{Selector: &metav1.LabelSelector{MatchLabels: labels}}}}
	for node, ready := range pods {
		status := corev1.ConditionFalse
		if ready {
			status = corev1.ConditionTrue
		}
		objs = append(objs, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "flannel-" + node, Namespace: "kube-system", Labels: labels},
			Spec:   corev1.PodSpec{NodeName: node},
			Status: corev1.PodStatus{Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: status}}}})
	}
	return objs
}

func objects(objs ...any) []runtime.Object {
	var out []runtime.Object
	for _, o := range objs {
		switch o := o.(type) {
		case runtime.Object:
			out = append(out, o)
		case []runtime.Object:
			out = append(out, o...)
		}
	}
	return out
}

func healthyObjects() []runtime.Object {
	// worker-0 is joining: its pod network is not ready yet, and that
	// does not concern the control plane.
	return objects(controlPlanePod("etcd", true, 0), controlPlanePod("kube-apiserver", true, 1),
		coreDNS(2), flannel(map[string]bool{"cp-0": true, "worker-0": false}))
}

func config(client *fake.Clientset, readyz func(context.Context) error) Config {
	return Config{
		Client:         client,
		Readyz:         readyz,
		Deployments:    []Workload{{"kube-system", "coredns"}},
		DaemonSets:     []Workload{{"kube-system", "flannel"}},
		Window:         60 * time.Millisecond,
		ServicesWindow: 20 * time.Millisecond,
		Interval:       5 * time.Millisecond,
	}
}

func readyzOK(context.Context) error { return nil }

func TestWaitSteady(t *testing.T) {
	tests := map[string]struct {
		objects []runtime.Object
		readyz  func(context.Context) error
		// onListPods, if set, runs on every list of control-plane pods.
		onListPods func(c *fake.Clientset)
		wantErr    []string
	}{
		"healthy and steady": {objects: healthyObjects(), readyz: readyzOK},
		"API server not ready": {objects: healthyObjects(), readyz: func(context.Context) error {
			return errors.New("API server /readyz: [-]etcd failed")
		}, wantErr: []string{"did not become steadily healthy", "[-]etcd failed"}},
		"CoreDNS not available": {
			objects: objects(controlPlanePod("etcd", true, 0), coreDNS(0), flannel(map[string]bool{"cp-0": true})),
			readyz:  readyzOK, wantErr: []string{"deployment kube-system/coredns: none of 2 replicas available"}},
		// The second replica waits for a joining worker.
		"CoreDNS answers with one replica": {
			objects: objects(controlPlanePod("etcd", true, 0), coreDNS(1), flannel(map[string]bool{"cp-0": true})),
			readyz:  readyzOK},
		"CoreDNS missing": {
			objects: objects(controlPlanePod("etcd", true, 0), flannel(map[string]bool{"cp-0": true})),
			readyz:  readyzOK, wantErr: []string{"deployment kube-system/coredns", "not found"}},
		"pod network not ready on the control plane": {
			objects: objects(controlPlanePod("etcd", true, 0), coreDNS(2), flannel(map[string]bool{"cp-0": false, "worker-0": true})),
			readyz:  readyzOK, wantErr: []string{"daemonset kube-system/flannel: pod flannel-cp-0 on cp-0 is not ready"}},
		"pod network not on the control plane": {
			objects: objects(controlPlanePod("etcd", true, 0), coreDNS(2), flannel(map[string]bool{"worker-0": true})),
			readyz:  readyzOK, wantErr: []string{"daemonset kube-system/flannel: no pod on cp-0"}},
		"no control plane pods": {
			objects: objects(coreDNS(2), flannel(map[string]bool{"cp-0": true})),
			readyz:  readyzOK, wantErr: []string{"no control-plane pods yet"}},
		"etcd not ready": {
			objects: objects(controlPlanePod("etcd", false, 0), coreDNS(2), flannel(map[string]bool{"cp-0": true})),
			readyz:  readyzOK, wantErr: []string{"etcd is not ready"}},
		// Each check sees the API server restarted once more: healthy at
		// every instant, never steady.
		"API server keeps restarting": {objects: healthyObjects(), readyz: readyzOK,
			onListPods: func(c *fake.Clientset) {
				p, _ := c.Tracker().Get(corev1.SchemeGroupVersion.WithResource("pods"), "kube-system", "kube-apiserver-cp-0")
				pod := p.(*corev1.Pod).DeepCopy()
				pod.Status.ContainerStatuses[0].RestartCount++
				_ = c.Tracker().Update(corev1.SchemeGroupVersion.WithResource("pods"), pod, "kube-system")
			},
			wantErr: []string{"kube-apiserver restarted (exit code 137, Error)"}},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			client := fake.NewClientset(tc.objects...)
			if tc.onListPods != nil {
				client.PrependReactor("list", "pods", func(k8stesting.Action) (bool, runtime.Object, error) {
					tc.onListPods(client)
					return false, nil, nil
				})
			}
			ctx, cancel := context.WithTimeout(context.Background(), 400*time.Millisecond)
			defer cancel()
			var progress strings.Builder
			cfg := config(client, tc.readyz)
			cfg.Progress = func(msg string) { progress.WriteString(msg + "\n") }
			err := WaitSteady(ctx, cfg)
			if len(tc.wantErr) == 0 {
				if err != nil {
					t.Fatalf("WaitSteady: %v\nprogress:\n%s", err, progress.String())
				}
				return
			}
			if err == nil {
				t.Fatalf("WaitSteady succeeded, want an error with %q", tc.wantErr)
			}
			for _, w := range tc.wantErr {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q lacks %q", err, w)
				}
			}
		})
	}
}

// A control plane that recovers is steady once it has stayed healthy for
// the whole window after its last failure.
func TestWaitSteadyAfterRecovery(t *testing.T) {
	var calls atomic.Int32
	var lastFailure atomic.Int64
	readyz := func(context.Context) error {
		if calls.Add(1) <= 5 {
			lastFailure.Store(time.Now().UnixNano())
			return errors.New("connection refused")
		}
		return nil
	}
	cfg := config(fake.NewClientset(healthyObjects()...), readyz)
	var progress strings.Builder
	cfg.Progress = func(msg string) { progress.WriteString(msg + "\n") }
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := WaitSteady(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	if since := time.Since(time.Unix(0, lastFailure.Load())); since < cfg.Window {
		t.Errorf("steady %s after the last failure, want at least the window %s", since, cfg.Window)
	}
	if !strings.Contains(progress.String(), "waiting for the control plane: connection refused") {
		t.Errorf("progress does not say what it waited for:\n%s", progress.String())
	}
}

// The control plane's window runs while the services start: services
// that become ready after it has passed need their own window only, and
// a control plane that fails meanwhile starts its window again.
func TestWaitSteadyWatchesControlPlaneWhileServicesStart(t *testing.T) {
	client := fake.NewClientset(objects(controlPlanePod("etcd", true, 0), controlPlanePod("kube-apiserver", true, 1), flannel(map[string]bool{"cp-0": true}))...)
	var failedAt atomic.Int64
	var calls atomic.Int32
	readyz := func(context.Context) error {
		// One failure early on, while CoreDNS does not exist yet.
		if calls.Add(1) == 3 {
			failedAt.Store(time.Now().UnixNano())
			return errors.New("connection refused")
		}
		return nil
	}
	cfg := config(client, readyz)
	cfg.Window, cfg.ServicesWindow = 300*time.Millisecond, 50*time.Millisecond
	start := time.Now()
	servicesReady := start.Add(600 * time.Millisecond)
	go func() {
		time.Sleep(time.Until(servicesReady))
		_ = client.Tracker().Add(coreDNS(1))
	}()
	var progress strings.Builder
	cfg.Progress = func(msg string) { progress.WriteString(msg + "\n") }
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := WaitSteady(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	done := time.Now()
	if done.Sub(time.Unix(0, failedAt.Load())) < cfg.Window {
		t.Errorf("steady %s after the control plane's failure, want at least %s", done.Sub(time.Unix(0, failedAt.Load())), cfg.Window)
	}
	if done.Sub(servicesReady) < cfg.ServicesWindow {
		t.Errorf("done %s after the services were ready, want at least %s", done.Sub(servicesReady), cfg.ServicesWindow)
	}
	// Not the two windows one after the other.
	if late := done.Sub(servicesReady); late > cfg.Window {
		t.Errorf("done %s after the services were ready: the control plane's window was not watched while they started", late)
	}
	for _, want := range []string{"waiting for the control plane: deployment kube-system/coredns", "services ready; checking that they stay so"} {
		if !strings.Contains(progress.String(), want) {
			t.Errorf("progress lacks %q:\n%s", want, progress.String())
		}
	}
}

// When the deadline cuts a check short, the error names what the checks
// before it found, not the cut request's "context deadline exceeded".
func TestWaitSteadyDeadlineCutsACheck(t *testing.T) {
	client := fake.NewClientset(objects(controlPlanePod("etcd", true, 0), coreDNS(0), flannel(map[string]bool{"cp-0": true}))...)
	start := time.Now()
	readyz := func(ctx context.Context) error {
		if time.Since(start) < 200*time.Millisecond {
			return nil
		}
		// A starved API server: the request outlives the wait.
		<-ctx.Done()
		return fmt.Errorf("API server /readyz: %w", ctx.Err())
	}
	ctx, cancel := context.WithTimeout(context.Background(), 400*time.Millisecond)
	defer cancel()
	err := WaitSteady(ctx, config(client, readyz))
	if err == nil {
		t.Fatal("WaitSteady succeeded without CoreDNS")
	}
	if want := "deployment kube-system/coredns: none of 2 replicas available (for the last "; !strings.Contains(err.Error(), want) {
		t.Errorf("error %q lacks %q", err, want)
	}
	if strings.Contains(err.Error(), "deadline exceeded") {
		t.Errorf("error %q blames the request the deadline cut", err)
	}
}

// Checks that pass but have not yet for the whole window say so.
func TestWaitSteadyWindowNotReached(t *testing.T) {
	cfg := config(fake.NewClientset(healthyObjects()...), readyzOK)
	cfg.Window = time.Hour
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	err := WaitSteady(ctx, cfg)
	if err == nil || !strings.Contains(err.Error(), "every check passed for the last 0s, less than the 1h0m0s required") {
		t.Fatalf("WaitSteady = %v, want the window it did not reach", err)
	}
}

func TestWaitSteadyNeedsClient(t *testing.T) {
	if err := WaitSteady(context.Background(), Config{}); err == nil {
		t.Fatal("no client accepted")
	}
}

func TestFailedChecks(t *testing.T) {
	body := "[+]ping ok\n[+]log ok\n[-]etcd failed: reason withheld\n[-]etcd-readiness failed: reason withheld\n[+]informer-sync ok\n[+]poststarthook/start-apiserver-admission-initializer ok\nreadyz check failed"
	tests := map[string]struct{ text, want string }{
		"body":               {body, "failing checks: etcd, etcd-readiness"},
		"quoted in an error": {`an error on the server ("` + strings.ReplaceAll(body, "\n", `\n`) + `") has prevented the request from succeeding`, "failing checks: etcd, etcd-readiness"},
		"poststarthook":      {"[-]poststarthook/rbac/bootstrap-roles failed: not finished", "failing checks: poststarthook/rbac/bootstrap-roles"},
		"nothing failing":    {"connection refused", ""},
	}
	for name, tc := range tests {
		if got := failedChecks(tc.text); got != tc.want {
			t.Errorf("%s: failedChecks = %q, want %q", name, got, tc.want)
		}
	}
}

func TestWaitAPIServer(t *testing.T) {
	calls := 0
	var said []string
	cfg := Config{
		Readyz: func(context.Context) error {
			calls++
			if calls < 3 {
				return errors.New(`API server /readyz: Get "https://10.42.0.2:6443/readyz": EOF`)
			}
			return nil
		},
		Interval: time.Millisecond,
		Progress: func(msg string) { said = append(said, msg) },
	}
	if err := WaitAPIServer(context.Background(), cfg); err != nil {
		t.Fatalf("WaitAPIServer: %v", err)
	}
	if calls != 3 {
		t.Errorf("asked /readyz %d times, want 3 (until it passes)", calls)
	}
	if len(said) != 2 || !strings.Contains(said[0], "EOF") || !strings.Contains(said[1], "answers") {
		t.Errorf("progress = %q, want the first failure and the answer", said)
	}
}

func TestWaitAPIServerGivesUp(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	err := WaitAPIServer(ctx, Config{
		Readyz:   func(context.Context) error { return errors.New("API server /readyz: [-]etcd failed") },
		Interval: 5 * time.Millisecond,
	})
	if err == nil || !strings.Contains(err.Error(), "did not become ready") || !strings.Contains(err.Error(), "[-]etcd failed") {
		t.Fatalf("err = %v, want one that says the API server never became ready and why", err)
	}
}

func TestWaitAPIServerNeedsClient(t *testing.T) {
	if err := WaitAPIServer(context.Background(), Config{}); err == nil {
		t.Fatal("no client accepted")
	}
}
