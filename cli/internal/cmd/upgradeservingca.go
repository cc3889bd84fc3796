package cmd

import (
	"context"
	"fmt"
	"io"
	"strings"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/orrery-dev/orrery/internal/owner/kubeupgrade"
	"github.com/orrery-dev/orrery/internal/owner/workspace"
)

// servingLifetimePolicy is the orrery-services chart's policy that asks
// serving certificates for hours: the join service's approver denies a
// kubelet's request without it, so a cluster moves to the kubelet-serving
// CA only once its services are current.
const servingLifetimePolicy = "orrery-serving-lifetime"

// servingCAWait is how long a kubelet may take, once it renewed, until the
// API server reaches it: its restart, its request, the approver and the
// controller manager's signature. Under TCG a kubelet restart took up to
// a minute.
const servingCAWait = 5 * time.Minute

// servingCAMove is what a move to the kubelet-serving CA does: the control
// planes to move, or, when none is left, the kubelets that the API server
// does not reach with their serving certificates (a move cut short).
type servingCAMove struct {
	move, renew []kubeupgrade.Node
}

func (m servingCAMove) needed() bool { return len(m.move) > 0 || len(m.renew) > 0 }

// planServingCA says whether the cluster in state must move to the
// kubelet-serving CA, and refuses the move while the cluster's services
// are older than it.
func planServingCA(ctx context.Context, client kubernetes.Interface, state kubeupgrade.State) (servingCAMove, error) {
	var m servingCAMove
	if m.move = state.ToMove(); len(m.move) == 0 {
		for _, n := range state.Nodes {
			if kubeupgrade.KubeletReached(ctx, client, n.Name) != nil {
				m.renew = append(m.renew, n)
			}
		}
		return m, nil
	}
	_, err := client.AdmissionregistrationV1().MutatingAdmissionPolicies().Get(ctx, servingLifetimePolicy, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return m, fmt.Errorf("%w: the cluster's control planes sign kubelets' serving certificates with the cluster CA, and its services are older than the kubelet-serving CA that replaces it (no MutatingAdmissionPolicy %s): run 'orrery upgrade apply' without --kubernetes-version first", kubeupgrade.ErrRefused, servingLifetimePolicy)
	}
	if err != nil {
		return m, fmt.Errorf("read the cluster's admission policy %s: %w", servingLifetimePolicy, err)
	}
	return m, nil
}

func writeServingCAPlan(w io.Writer, m servingCAMove) {
	switch {
	case len(m.move) > 0:
		fmt.Fprintf(w, "Kubelet serving certificates: the API servers of %s check kubelets against the cluster CA; first, each moves to a CA of kubelets' own, then every kubelet asks for a new certificate. 'kubectl logs' and 'exec' to a node fail from its control plane's move until its kubelet's new certificate (under a minute per control plane, then up to %s).\n",
			names(m.move), servingCAWait)
	case len(m.renew) > 0:
		fmt.Fprintf(w, "Kubelet serving certificates: the API server does not reach the kubelets of %s; each asks for a new certificate first.\n", names(m.renew))
	}
}

func names(nodes []kubeupgrade.Node) string {
	var out []string
	for _, n := range nodes {
		out = append(out, n.Name)
	}
	return strings.Join(out, ", ")
}

// moveServingCA moves the cluster to the kubelet-serving CA with the pair
// the workspace keeps for it, and lets the pair go once every control
// plane took it.
func (u kubeUpgrade) moveServingCA(ctx context.Context, client kubernetes.Interface, state kubeupgrade.State, nodeTimeout time.Duration) error {
	ws := u.o.workspace
	cfg := kubeupgrade.MoveConfig{
		Client: client, NodeTimeout: nodeTimeout, ServeWait: servingCAWait,
		Say:  func(format string, args ...any) { fmt.Fprintf(u.out, format+"\n", args...) },
		Pair: func() ([]byte, []byte, error) { return ws.KubeletServingCA(time.Now()) },
		Connect: func(ctx context.Context, n kubeupgrade.Node) (kubeupgrade.ServingCAClient, error) {
			return u.dial(ctx, n)
		},
	}
	if err := kubeupgrade.MoveServingCA(ctx, cfg, state); err != nil {
		return fmt.Errorf("%w\nNothing of Kubernetes' version changed. Once its cause is fixed, the same command goes on with the move where it stopped (the pair every control plane must get is kept in %s until then)", err, ws.Path(workspace.KubeletServingCAFile))
	}
	if err := ws.RemoveKubeletServingCA(); err != nil {
		fmt.Fprintf(u.out, "warning: could not remove the kubelet-serving CA's pair from the workspace (the control planes hold it): %v\n", err)
	}
	return nil
}
