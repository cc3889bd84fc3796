package kubeupgrade

import (
	"errors"
	"strings"
	"testing"

	"github.com/orrery-dev/orrery/internal/versions"
)

const (
	v36 = "v1.36.3"
	v37 = "v1.37.2"
)

func cp(name, kubelet, components string) Node {
	c := map[string]string{}
	for _, comp := range Components {
		c[comp] = components
	}
	return Node{Name: name, ControlPlane: true, Kubelet: kubelet, Ready: true, Components: c}
}

func worker(name, kubelet string) Node {
	return Node{Name: name, Kubelet: kubelet, Ready: true}
}

// carriedByAll is each node of s saying that its image carries vs and
// that it runs what its Node says.
func carriedByAll(s State, vs ...string) map[string]Releases {
	m := map[string]Releases{}
	for _, n := range s.Nodes {
		m[n.Name] = Releases{Carried: vs, Running: n.Kubelet, ControlPlane: n.ControlPlane}
	}
	return m
}

func TestPlanOrdersControlPlanesFirstAndAppliesOnTheFirst(t *testing.T) {
	s := State{ClusterVersion: v36, KubeProxy: v36, Nodes: []Node{cp("cp-0", v36, v36), cp("cp-1", v36, v36), worker("worker-0", v36), worker("worker-1", v36)}}
	p, err := MakePlan(s, v37, carriedByAll(s, v36, v37))
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, st := range p.Steps {
		got = append(got, st.Node.Name+map[bool]string{true: "(apply)", false: ""}[st.Apply]+map[bool]string{true: "(done)", false: ""}[st.Done])
	}
	if strings.Join(got, " ") != "cp-0(apply) cp-1 worker-0 worker-1" || p.From != v36 || p.To != v37 {
		t.Errorf("plan %s from %s to %s", got, p.From, p.To)
	}
}

// A plan made again after an interruption starts where the last stopped.
func TestPlanGoesOnWhereAnUpgradeStopped(t *testing.T) {
	for _, c := range []struct {
		name    string
		state   State
		pending string
	}{
		{"nothing done", State{ClusterVersion: v36, KubeProxy: v36, Nodes: []Node{cp("cp-0", v36, v36), worker("w-0", v36), worker("w-1", v36)}}, "cp-0 w-0 w-1"},
		{"apply stopped before kube-proxy", State{ClusterVersion: v37, KubeProxy: v36, Nodes: []Node{cp("cp-0", v37, v37), worker("w-0", v36), worker("w-1", v36)}}, "cp-0 w-0 w-1"},
		{"control plane's kubelet not switched", State{ClusterVersion: v37, KubeProxy: v37, Nodes: []Node{cp("cp-0", v36, v37), worker("w-0", v36), worker("w-1", v36)}}, "cp-0 w-0 w-1"},
		{"control plane done", State{ClusterVersion: v37, KubeProxy: v37, Nodes: []Node{cp("cp-0", v37, v37), worker("w-0", v36), worker("w-1", v36)}}, "w-0 w-1"},
		{"a worker upgraded but still cordoned", State{ClusterVersion: v37, KubeProxy: v37, Nodes: []Node{cp("cp-0", v37, v37), {Name: "w-0", Kubelet: v37, Ready: true, Cordoned: true, CordonedFor: v37}, worker("w-1", v36)}}, "w-0 w-1"},
		{"one worker done", State{ClusterVersion: v37, KubeProxy: v37, Nodes: []Node{cp("cp-0", v37, v37), worker("w-0", v37), worker("w-1", v36)}}, "w-1"},
		{"all done", State{ClusterVersion: v37, KubeProxy: v37, Nodes: []Node{cp("cp-0", v37, v37), worker("w-0", v37), worker("w-1", v37)}}, ""},
		{"no kube-proxy", State{ClusterVersion: v37, Nodes: []Node{cp("cp-0", v37, v37)}}, ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			p, err := MakePlan(c.state, v37, carriedByAll(c.state, v36, v37))
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, st := range p.Pending() {
				got = append(got, st.Node.Name)
			}
			if strings.Join(got, " ") != c.pending {
				t.Errorf("pending %q, want %q", got, c.pending)
			}
		})
	}
}

func TestPlanRefusals(t *testing.T) {
	healthy := func() State {
		return State{ClusterVersion: v36, KubeProxy: v36, Nodes: []Node{cp("cp-0", v36, v36), worker("w-0", v36)}}
	}
	for _, c := range []struct {
		name    string
		change  func(*State, map[string]Releases)
		to      string
		wantErr []string
		wantIs  error
	}{
		{"a downgrade", func(s *State, _ map[string]Releases) { s.ClusterVersion = v37 }, v36, []string{"cannot be downgraded"}, versions.ErrDowngrade},
		{"a skipped minor", func(s *State, c map[string]Releases) {
			for _, n := range []string{"cp-0", "w-0"} {
				r := c[n]
				r.Carried = append(r.Carried, "v1.38.0")
				c[n] = r
			}
		}, "v1.38.0", []string{"one minor version at a time"}, versions.ErrSkipsMinor},
		{"a kubelet a minor behind the cluster", func(s *State, _ map[string]Releases) {
			s.ClusterVersion, s.Nodes[0] = v37, cp("cp-0", v37, v37)
			s.Nodes[1].Kubelet = "v1.35.0"
		}, "v1.38.0", []string{"node w-0's kubelet runs v1.35.0"}, versions.ErrSkipsMinor},
		{"a node whose image lacks it", func(_ *State, c map[string]Releases) { c["w-0"] = Releases{Carried: []string{v36}, Running: v36} }, v37, []string{"lack Kubernetes v1.37.2: w-0 (carries v1.36.3)"}, nil},
		{"a node that did not answer", func(_ *State, c map[string]Releases) { delete(c, "w-0") }, v37, []string{"w-0 (carries none)"}, nil},
		{"a node not Ready", func(s *State, _ map[string]Releases) { s.Nodes[1].Ready = false }, v37, []string{"nodes not Ready: w-0"}, nil},
		{"a control plane on another version", func(s *State, _ map[string]Releases) { s.Nodes[0].Components["kube-scheduler"] = "v1.35.0" }, v37, []string{"runs kube-scheduler v1.35.0"}, nil},
		{"a control plane's component not running", func(s *State, _ map[string]Releases) { delete(s.Nodes[0].Components, "kube-apiserver") }, v37, []string{"runs kube-apiserver none"}, nil},
		{"a Node that says less than its node runs", func(s *State, c map[string]Releases) {
			c["w-0"] = Releases{Carried: []string{"v1.35.0", v36, v37}, Running: "v1.35.0"}
		}, v37, []string{"node w-0 runs Kubernetes v1.35.0, its Node says v1.36.3"}, versions.ErrSkipsMinor},
		{"no control plane", func(s *State, _ map[string]Releases) { s.Nodes = s.Nodes[1:] }, v37, []string{"no control plane"}, nil},
	} {
		t.Run(c.name, func(t *testing.T) {
			s := healthy()
			carried := carriedByAll(s, v36, v37)
			c.change(&s, carried)
			_, err := MakePlan(s, c.to, carried)
			if !errors.Is(err, ErrRefused) {
				t.Fatalf("MakePlan = %v, want a refusal", err)
			}
			for _, w := range c.wantErr {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("refusal %q does not say %q", err, w)
				}
			}
			if c.wantIs != nil && !errors.Is(err, c.wantIs) {
				t.Errorf("refusal %v is not %v", err, c.wantIs)
			}
		})
	}
}

func TestImageTag(t *testing.T) {
	for ref, want := range map[string]string{
		"registry.k8s.io/kube-proxy:v1.37.2":            "v1.37.2",
		"registry.k8s.io/kube-proxy:v1.37.2@sha256:abc": "v1.37.2",
		"localhost:5000/kube-proxy":                     "",
		"kube-proxy":                                    "",
	} {
		if got := imageTag(ref); got != want {
			t.Errorf("imageTag(%q) = %q, want %q", ref, got, want)
		}
	}
}

// A worker's kubelet credential writes its own Node's status: a Node
// that claims the target while the node's attested service says it runs
// the old release is upgraded all the same.
func TestPlanTrustsTheNodeNotItsNodeObject(t *testing.T) {
	s := State{ClusterVersion: v37, KubeProxy: v37, Nodes: []Node{cp("cp-0", v37, v37), worker("w-0", v37)}}
	told := carriedByAll(s, v36, v37)
	told["w-0"] = Releases{Carried: []string{v36, v37}, Running: v36}
	p, err := MakePlan(s, v37, told)
	if err != nil {
		t.Fatal(err)
	}
	if pending := p.Pending(); len(pending) != 1 || pending[0].Node.Name != "w-0" {
		t.Errorf("pending %v, want w-0", pending)
	}
}
