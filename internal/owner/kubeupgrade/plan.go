package kubeupgrade

import (
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/orrery-dev/orrery/internal/versions"
)

// Step is one node's upgrade.
type Step struct {
	Node Node
	// Apply runs kubeadm upgrade apply (the first control plane), which
	// also moves the cluster's record and add-ons; otherwise kubeadm
	// upgrade node.
	Apply bool
	// Done means the node runs the target already: kubelet and, on a
	// control plane, its components (and for Apply, the cluster's record
	// and kube-proxy), and the upgrade left no cordon of its own on it.
	Done bool
}

// Plan is an upgrade of the cluster from From to To, node by node.
type Plan struct {
	From, To string
	Steps    []Step
}

// Pending is the steps not done.
func (p Plan) Pending() []Step {
	var out []Step
	for _, s := range p.Steps {
		if !s.Done {
			out = append(out, s)
		}
	}
	return out
}

// ErrRefused wraps every reason MakePlan refuses an upgrade for.
var ErrRefused = errors.New("the upgrade is refused, and nothing was changed")

// MakePlan plans the upgrade of the cluster in state s to version to
// (vMAJOR.MINOR.PATCH). carried says which releases each node's image
// carries, by node name, as each node said itself. It refuses, before
// anything changes:
//   - a downgrade, or more than one minor at once, from the cluster's
//     version or any node's kubelet;
//   - a version that some node's image does not carry;
//   - a cluster with a node that is not Ready, or a control plane whose
//     components do not run the cluster's version or the target.
//
// told is what each node's upgrade service said over attested TLS. A
// node counts as upgraded only when its Node and its own service agree:
// a kubelet writes its Node's status itself, so a stolen kubelet
// credential could otherwise claim the target and have its node skipped.
func MakePlan(s State, to string, told map[string]Releases) (Plan, error) {
	p := Plan{From: s.ClusterVersion, To: to}
	var errs []error
	if err := versions.CheckUpgrade(s.ClusterVersion, to); err != nil {
		errs = append(errs, err)
	}
	var lacking, notReady []string
	firstCP := true
	for _, n := range s.Nodes {
		r, answered := told[n.Name]
		if err := versions.CheckUpgrade(n.Kubelet, to); err != nil {
			errs = append(errs, fmt.Errorf("node %s's kubelet runs %s: %w", n.Name, n.Kubelet, err))
		} else if answered && r.Running != n.Kubelet {
			if err := versions.CheckUpgrade(r.Running, to); err != nil {
				errs = append(errs, fmt.Errorf("node %s runs Kubernetes %s, its Node says %s: %w", n.Name, orNone([]string{r.Running}), n.Kubelet, err))
			}
		}
		if !n.Ready {
			notReady = append(notReady, n.Name)
		}
		if !answered || !slices.Contains(r.Carried, to) {
			lacking = append(lacking, fmt.Sprintf("%s (carries %s)", n.Name, orNone(r.Carried)))
		}
		st := Step{Node: n, Apply: n.ControlPlane && firstCP}
		if n.ControlPlane {
			firstCP = false
			for _, c := range Components {
				v := n.Components[c]
				if v != s.ClusterVersion && v != to {
					errs = append(errs, fmt.Errorf("control plane %s runs %s %s, neither the cluster's %s nor %s: see 'kubectl -n kube-system get pods -o wide' and 'orrery logs %s kubelet'", n.Name, c, orNone([]string{v}), s.ClusterVersion, to, n.Name))
				}
			}
		}
		st.Done = done(s, st, to) && r.Running == to
		p.Steps = append(p.Steps, st)
	}
	if firstCP {
		errs = append(errs, errors.New("the cluster lists no control plane (no node labelled "+controlPlaneLabel+")"))
	}
	if len(notReady) > 0 {
		errs = append(errs, fmt.Errorf("nodes not Ready: %s; an upgrade starts from a healthy cluster: bring them back or remove them ('orrery node remove NAME')", strings.Join(notReady, ", ")))
	}
	if len(lacking) > 0 {
		errs = append(errs, fmt.Errorf("the images of these nodes lack Kubernetes %s: %s; move them to an image that carries it first (see 'orrery upgrade check')", to, strings.Join(lacking, ", ")))
	}
	if len(errs) > 0 {
		return Plan{}, fmt.Errorf("%w:\n%w", ErrRefused, errors.Join(errs...))
	}
	return p, nil
}

func done(s State, st Step, to string) bool {
	n := st.Node
	if n.Kubelet != to || n.CordonedFor != "" {
		return false
	}
	for _, c := range Components {
		if n.ControlPlane && n.Components[c] != to {
			return false
		}
	}
	return !st.Apply || (s.ClusterVersion == to && (s.KubeProxy == "" || s.KubeProxy == to))
}

func orNone(vs []string) string {
	var out []string
	for _, v := range vs {
		if v != "" {
			out = append(out, v)
		}
	}
	if len(out) == 0 {
		return "none"
	}
	return strings.Join(out, ", ")
}
