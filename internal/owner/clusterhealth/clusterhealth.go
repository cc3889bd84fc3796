// Package clusterhealth tells whether a new cluster is ready for its
// owner: the API server answers, the control-plane pods are ready and do
// not restart, and the cluster's own services are available, every check
// passing again and again for a while. A control plane that comes up and
// falls over a minute later (seen on a starved host) is not ready, and the
// owner is told what is wrong instead of "done".
package clusterhealth

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strings"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// Workload names a Deployment or DaemonSet.
type Workload struct {
	Namespace, Name string
}

func (w Workload) String() string { return w.Namespace + "/" + w.Name }

// Config says what a steady cluster is.
type Config struct {
	// Client talks to the cluster. Required.
	Client kubernetes.Interface
	// Readyz asks the API server's /readyz. Nil means Client's.
	Readyz func(ctx context.Context) error
	// Deployments must have a replica available (CoreDNS).
	Deployments []Workload
	// DaemonSets must have a ready pod on every control-plane node.
	DaemonSets []Workload
	// Window is how long the control plane (API server, control-plane
	// pods, no restarts) must keep passing. Zero means 30 s.
	Window time.Duration
	// ServicesWindow is how long the services (Deployments, DaemonSets)
	// must keep passing, with the control plane. Zero means 10 s.
	ServicesWindow time.Duration
	// Interval is the time between checks. Zero means 2 s.
	Interval time.Duration
	// Progress receives a message when the state changes; nil discards.
	Progress func(msg string)
}

// ControlPlaneLabel selects kubeadm's static control-plane pods.
const ControlPlaneLabel = "tier=control-plane"

// WaitSteady returns nil once the control plane has passed every check
// without a break for cfg.Window and the services, checked with it, for
// cfg.ServicesWindow. It returns an error when ctx ends first, saying
// what the last finished check found and since when, and which
// control-plane containers restarted.
//
// The two windows run at once: the control plane's starts when the API
// server first answers, which on a new cluster is a minute or more
// before the pod network and CoreDNS are ready (under TCG), so its
// steadiness is watched while they start rather than after them. A
// control plane that falls over while they start restarts its window.
func WaitSteady(ctx context.Context, cfg Config) error {
	if cfg.Client == nil {
		return errors.New("clusterhealth: no client")
	}
	cfg = cfg.withDefaults()
	c := checker{cfg: cfg, restarts: map[string]int32{}}
	var w windows
	for {
		cpProblem, svcProblem := c.check(ctx)
		now := time.Now()
		if ctx.Err() != nil {
			return c.timeoutError(w.last(now, firstOf(cpProblem, svcProblem)))
		}
		if w.observe(cfg, now, cpProblem, svcProblem) {
			return nil
		}
		select {
		case <-ctx.Done():
			return c.timeoutError(w.lastProblem, time.Since(w.problemSince))
		case <-time.After(cfg.Interval):
		}
	}
}

// readyzAskTimeout bounds one ask of /readyz in WaitAPIServer.
const readyzAskTimeout = 20 * time.Second

// WaitAPIServer returns nil once the API server's /readyz passes, asking
// every cfg.Interval; only cfg.Client (or cfg.Readyz), cfg.Interval and
// cfg.Progress count. It is for a control plane that is still starting,
// such as one that was rebooted between two runs of 'orrery init': its
// API server drops connections for a minute or more before it answers.
// Progress hears of the first failure and of every tenth; the error
// after ctx ends names the last.
func WaitAPIServer(ctx context.Context, cfg Config) error {
	if cfg.Client == nil && cfg.Readyz == nil {
		return errors.New("clusterhealth: no client")
	}
	cfg = cfg.withDefaults()
	start := time.Now()
	for attempt := 1; ; attempt++ {
		// client-go retries a GET that meets EOF ten times over, so
		// one unbounded ask is silent for minutes.
		askCtx, cancel := context.WithTimeout(ctx, readyzAskTimeout)
		err := cfg.Readyz(askCtx)
		cancel()
		if err == nil {
			if attempt > 1 {
				cfg.Progress(fmt.Sprintf("the API server answers (%s)", time.Since(start).Round(time.Second)))
			}
			return nil
		}
		if ctx.Err() != nil {
			return fmt.Errorf("the API server did not become ready in %s: %w", time.Since(start).Round(time.Second), err)
		}
		if attempt == 1 || attempt%10 == 0 {
			cfg.Progress(fmt.Sprintf("waiting for the API server: %v", err))
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("the API server did not become ready in %s: %w", time.Since(start).Round(time.Second), err)
		case <-time.After(cfg.Interval):
		}
	}
}

// withDefaults fills in what the zero values of cfg's fields mean.
func (cfg Config) withDefaults() Config {
	if cfg.Readyz == nil && cfg.Client != nil {
		cfg.Readyz = readyz(cfg.Client)
	}
	if cfg.Window == 0 {
		cfg.Window = 30 * time.Second
	}
	if cfg.ServicesWindow == 0 {
		cfg.ServicesWindow = 10 * time.Second
	}
	if cfg.Interval == 0 {
		cfg.Interval = 2 * time.Second
	}
	if cfg.Progress == nil {
		cfg.Progress = func(string) {}
	}
	return cfg
}

// readyz asks client's API server for /readyz, and names the checks that
// fail rather than quote its answer.
func readyz(client kubernetes.Interface) func(ctx context.Context) error {
	return func(ctx context.Context) error {
		body, err := client.Discovery().RESTClient().Get().AbsPath("/readyz").DoRaw(ctx)
		if err != nil {
			if failing := failedChecks(err.Error()); failing != "" {
				return fmt.Errorf("API server /readyz: %s", failing)
			}
			return fmt.Errorf("API server /readyz: %w", err)
		}
		if strings.TrimSpace(string(body)) != "ok" {
			if failing := failedChecks(string(body)); failing != "" {
				return fmt.Errorf("API server /readyz: %s", failing)
			}
			return fmt.Errorf("API server /readyz: %.200q", body)
		}
		return nil
	}
}

// windows are the runs of passing checks that WaitSteady waits on, and
// the problem that last broke them.
type windows struct {
	// controlPlaneSince and servicesSince start the current runs of
	// passing checks; zero while a check fails.
	controlPlaneSince, servicesSince time.Time
	// lastProblem is what the last finished check found ("" if nothing),
	// and problemSince when checks began to find it.
	lastProblem  string
	problemSince time.Time
}

// observe records the problems one finished check found at now, tells
// cfg.Progress of every change, and reports whether both windows are
// complete.
func (w *windows) observe(cfg Config, now time.Time, cpProblem, svcProblem string) bool {
	switch {
	case cpProblem != "":
		w.controlPlaneSince, w.servicesSince = time.Time{}, time.Time{}
	case w.controlPlaneSince.IsZero():
		w.controlPlaneSince = now
		cfg.Progress(fmt.Sprintf("control plane healthy; checking that it stays so for %s", cfg.Window))
	}
	switch {
	case cpProblem != "" || svcProblem != "":
		w.servicesSince = time.Time{}
	case w.servicesSince.IsZero():
		w.servicesSince = now
		cfg.Progress(fmt.Sprintf("services ready; checking that they stay so for %s", cfg.ServicesWindow))
	}
	if cpProblem == "" && svcProblem == "" && now.Sub(w.controlPlaneSince) >= cfg.Window && now.Sub(w.servicesSince) >= cfg.ServicesWindow {
		return true
	}
	problem := firstOf(cpProblem, svcProblem)
	if problem != w.lastProblem || w.problemSince.IsZero() {
		if problem != "" {
			cfg.Progress("waiting for the control plane: " + problem)
		}
		w.lastProblem, w.problemSince = problem, now
	}
	return false
}

// last returns, once the deadline cut a check short at now, what the
// last finished check found and for how long. The cut check's problem
// (cut) says nothing about the cluster; the checks before it do. On a
// starved host that was "CoreDNS: none available" for minutes while the
// last check reported only its own "context deadline exceeded". Only
// when no check finished before is the cut one all there is.
func (w *windows) last(now time.Time, cut string) (string, time.Duration) {
	if w.lastProblem == "" && w.problemSince.IsZero() {
		return cut, 0
	}
	return w.lastProblem, now.Sub(w.problemSince)
}

type checker struct {
	cfg Config
	// restarts are the restart counts of the control-plane containers at
	// the last check, by pod/container.
	restarts map[string]int32
	// restarted lists what restarted during the wait, for the final error.
	restarted []string
	// controlPlaneNodes are the nodes that run control-plane pods.
	controlPlaneNodes map[string]bool
}

// check runs every check once and returns the first problem of the
// control plane and of the services, or "". The services are not asked
// while the control plane has a problem.
func (c *checker) check(ctx context.Context) (controlPlane, services string) {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := c.cfg.Readyz(ctx); err != nil {
		return err.Error(), ""
	}
	if p := c.controlPlane(ctx); p != "" {
		return p, ""
	}
	for _, w := range c.cfg.Deployments {
		d, err := c.cfg.Client.AppsV1().Deployments(w.Namespace).Get(ctx, w.Name, metav1.GetOptions{})
		if err != nil {
			return "", fmt.Sprintf("deployment %s: %v", w, err)
		}
		if p := deploymentProblem(d); p != "" {
			return "", fmt.Sprintf("deployment %s: %s", w, p)
		}
	}
	for _, w := range c.cfg.DaemonSets {
		if p := c.daemonSet(ctx, w); p != "" {
			return "", fmt.Sprintf("daemonset %s: %s", w, p)
		}
	}
	return "", ""
}

// controlPlane checks that the static control-plane pods are ready and
// that none restarted since the last check.
func (c *checker) controlPlane(ctx context.Context) string {
	pods, err := c.cfg.Client.CoreV1().Pods("kube-system").List(ctx, metav1.ListOptions{LabelSelector: ControlPlaneLabel})
	if err != nil {
		return fmt.Sprintf("control-plane pods: %v", err)
	}
	if len(pods.Items) == 0 {
		return "no control-plane pods yet"
	}
	problem := ""
	c.controlPlaneNodes = map[string]bool{}
	for _, pod := range pods.Items {
		c.controlPlaneNodes[pod.Spec.NodeName] = true
		for _, cs := range pod.Status.ContainerStatuses {
			key := pod.Name + "/" + cs.Name
			if before, seen := c.restarts[key]; seen && cs.RestartCount > before {
				what := fmt.Sprintf("%s restarted (%s)", cs.Name, lastTermination(cs))
				c.restarted = append(c.restarted, what)
				if problem == "" {
					problem = what
				}
			}
			c.restarts[key] = cs.RestartCount
			if !cs.Ready && problem == "" {
				problem = fmt.Sprintf("%s is not ready", cs.Name)
			}
		}
	}
	return problem
}

func lastTermination(cs corev1.ContainerStatus) string {
	t := cs.LastTerminationState.Terminated
	if t == nil {
		return "reason unknown"
	}
	return fmt.Sprintf("exit code %d, %s", t.ExitCode, t.Reason)
}

// deploymentProblem asks for one available replica: the service answers.
// The others may be waiting for a worker that is still joining (CoreDNS's
// second replica went to the joining worker and held init for minutes),
// which says nothing about the control plane.
func deploymentProblem(d *appsv1.Deployment) string {
	want := int32(1)
	if d.Spec.Replicas != nil {
		want = *d.Spec.Replicas
	}
	if want > 0 && d.Status.AvailableReplicas < 1 {
		return fmt.Sprintf("none of %d replicas available", want)
	}
	return ""
}

// daemonSet checks that w's pods on the control-plane nodes are ready.
// Workers that join meanwhile are not waited for: their pods start when
// they are up, which says nothing about the control plane.
func (c *checker) daemonSet(ctx context.Context, w Workload) string {
	ds, err := c.cfg.Client.AppsV1().DaemonSets(w.Namespace).Get(ctx, w.Name, metav1.GetOptions{})
	if err != nil {
		return err.Error()
	}
	sel, err := metav1.LabelSelectorAsSelector(ds.Spec.Selector)
	if err != nil {
		return fmt.Sprintf("selector: %v", err)
	}
	pods, err := c.cfg.Client.CoreV1().Pods(w.Namespace).List(ctx, metav1.ListOptions{LabelSelector: sel.String()})
	if err != nil {
		return fmt.Sprintf("pods: %v", err)
	}
	for node := range c.controlPlaneNodes {
		i := slices.IndexFunc(pods.Items, func(p corev1.Pod) bool { return p.Spec.NodeName == node })
		if i < 0 {
			return "no pod on " + node
		}
		if !podReady(&pods.Items[i]) {
			return fmt.Sprintf("pod %s on %s is not ready", pods.Items[i].Name, node)
		}
	}
	return ""
}

func podReady(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// timeoutError says what the checks found last and for how long: a
// problem that lasted the whole wait (a service that never started) and
// one that came back a moment ago (a control plane that fell over) call
// for different remedies.
func (c *checker) timeoutError(lastProblem string, lasted time.Duration) error {
	msg := "the control plane did not become steadily healthy in time"
	lasted = lasted.Round(time.Second)
	if lastProblem != "" {
		msg += fmt.Sprintf(": %s (for the last %s)", lastProblem, lasted)
	} else {
		msg += fmt.Sprintf(": every check passed for the last %s, less than the %s required", lasted, max(c.cfg.Window, c.cfg.ServicesWindow))
	}
	if len(c.restarted) > 0 {
		msg += "; restarted meanwhile: " + strings.Join(slices.Compact(c.restarted), ", ")
	}
	return errors.New(msg)
}

// firstOf returns the first of problems that is not "".
func firstOf(problems ...string) string {
	for _, p := range problems {
		if p != "" {
			return p
		}
	}
	return ""
}

// failedCheck is how /readyz lists a check that did not pass.
var failedCheck = regexp.MustCompile(`\[-\]([a-zA-Z0-9/_.-]+) failed`)

// failedChecks names the failing checks in a /readyz answer (which lists
// forty passing ones beside them, too long for a progress line), or ""
// when it names none.
func failedChecks(text string) string {
	var names []string
	for _, m := range failedCheck.FindAllStringSubmatch(text, 10) {
		names = append(names, m[1])
	}
	if len(names) == 0 {
		return ""
	}
	return "failing checks: " + strings.Join(names, ", ")
}
