package toolout

import (
	"strings"
	"testing"
	"time"
)

func TestKubeadmPhase(t *testing.T) {
	tests := map[string]struct {
		line string
		want string
		ok   bool
	}{
		"phase":               {"[certs] Generating \"ca\" certificate and key", "certs", true},
		"dashed phase":        {"[control-plane-check] Checking kube-apiserver", "control-plane-check", true},
		"klog line":           {"I1123 09:35:23.028457     443 controller.go:201] msg", "", false},
		"not at the start":    {"  [certs] x", "", false},
		"empty brackets":      {"[] x", "", false},
		"capitals":            {"[WARNING Swap]: swap is on", "", false},
		"no closing":          {"[certs Generating", "", false},
		"a list, not phase":   {"[a, b]", "", false},
		"empty":               {"", "", false},
		"patches, a sub-step": {"[patches] Applied patch to target \"etcd\"", "", false},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			got, ok := KubeadmPhase(tc.line)
			if got != tc.want || ok != tc.ok {
				t.Errorf("KubeadmPhase(%q) = %q, %v; want %q, %v", tc.line, got, ok, tc.want, tc.ok)
			}
		})
	}
}

// Output arrives in chunks that cut lines anywhere; phases are reported
// once each, in order, and the tail keeps the end.
func TestFollower(t *testing.T) {
	out := "[init] Using Kubernetes version: v1.36.3\n[preflight] Running pre-flight checks\n[preflight] Pulling images\n" +
		"some line without a phase\n[certs] Using certificateDir folder\n[certs] Generating ca\n[kubeconfig] Writing admin.conf\n" +
		"error execution phase wait-control-plane: timed out\n"
	var phases []string
	f := &Follower{Keep: 64, OnPhase: func(p string) { phases = append(phases, p) }}
	for i := 0; i < len(out); i += 7 {
		f.Write([]byte(out[i:min(i+7, len(out))]))
	}
	if got := strings.Join(phases, " "); got != "init preflight certs kubeconfig" {
		t.Errorf("phases %q", got)
	}
	if len(f.Output()) != 64 || !strings.HasSuffix(string(f.Output()), "timed out\n") {
		t.Errorf("kept %d bytes: %q", len(f.Output()), f.Output())
	}
	if got := f.Tail(1); got != "error execution phase wait-control-plane: timed out" {
		t.Errorf("Tail(1) = %q", got)
	}
}

func TestTimeline(t *testing.T) {
	t0 := time.Unix(1000, 0)
	var tl Timeline
	tl.Begin("a", t0)
	tl.Begin("b", t0.Add(3*time.Second))
	steps := tl.Steps(t0.Add(10 * time.Second))
	if len(steps) != 2 || steps[0].Took != 3*time.Second || steps[1].Took != 7*time.Second || steps[1].Name != "b" {
		t.Fatalf("steps %+v", steps)
	}
	var b strings.Builder
	WriteSteps(&b, steps)
	if !strings.Contains(b.String(), "a  3s") || !strings.Contains(b.String(), "b  7s") {
		t.Errorf("table:\n%s", b.String())
	}
}
