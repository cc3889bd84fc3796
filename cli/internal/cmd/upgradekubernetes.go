package cmd

import (
	"context"
	"errors"
	"fmt"
	"io"
	"path/filepath"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"k8s.io/client-go/kubernetes"

	"github.com/orrery-dev/orrery/internal/owner/inspect"
	"github.com/orrery-dev/orrery/internal/owner/kubeupgrade"
	"github.com/orrery-dev/orrery/internal/versions"
)

// Waits of a Kubernetes upgrade. A control plane's kubeadm upgrade apply
// waits up to 15 min for each component it restarts (kubeadm's
// upgradeManifests timeout, as long as init's): a node may take 30 min.
const (
	kubeNodeTimeout  = 30 * time.Minute
	kubeDrainTimeout = 10 * time.Minute
	kubeReadyTimeout = 10 * time.Minute
)

// kubeUpgrade is 'upgrade apply --kubernetes-version'.
type kubeUpgrade struct {
	o     upgradeApplyOptions
	cmd   *cobra.Command
	out   io.Writer
	owner inspect.Owner
}

func runKubernetesUpgrade(cmd *cobra.Command, in io.Reader, out io.Writer, o upgradeApplyOptions) error {
	if err := o.checkKubernetesFlags(cmd); err != nil {
		return err
	}
	to, err := versions.Resolve(o.kubernetesVersion)
	if err != nil {
		return fmt.Errorf("--kubernetes-version: %w", err)
	}
	ctx := cmd.Context()
	owner, err := o.cluster.owner(cmd, nil)
	if err != nil {
		return err
	}
	rc, err := o.cluster.kc.restConfig(o.cluster.ws)
	if err != nil {
		return err
	}
	client, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return err
	}
	u := kubeUpgrade{o: o, cmd: cmd, out: out, owner: owner}
	plan, state, err := u.plan(ctx, client, to)
	if err != nil {
		return err
	}
	move, err := planServingCA(ctx, client, state)
	if err != nil {
		return err
	}
	writeKubePlan(out, plan)
	writeServingCAPlan(out, move)
	if len(plan.Pending()) == 0 && !move.needed() {
		fmt.Fprintf(out, "Every node runs Kubernetes %s: nothing to do.\n", to)
		return nil
	}
	if o.dryRun {
		fmt.Fprintln(out, "Dry run: nothing was changed.")
		return nil
	}
	if !o.yes {
		ok, err := confirm(in, out, fmt.Sprintf("Back up etcd and upgrade Kubernetes to %s?", to))
		if err != nil || !ok {
			if err == nil {
				fmt.Fprintln(out, "Nothing was changed.")
			}
			return err
		}
	}
	return u.apply(ctx, client, plan, state, move)
}

// checkKubernetesFlags refuses options of the chart upgrade beside
// --kubernetes-version: an upgrade changes one thing at a time.
func (o upgradeApplyOptions) checkKubernetesFlags(cmd *cobra.Command) error {
	for _, name := range []string{"retire", "force", "allow-weaker-evidence"} {
		if cmd.Flags().Changed(name) {
			return fmt.Errorf("--%s is an option of the upgrade of Orrery's releases: run 'orrery upgrade apply --%s' and 'orrery upgrade apply --kubernetes-version' one after the other", name, name)
		}
	}
	return nil
}

// plan reads the cluster, asks every node which releases its image
// carries, and plans the upgrade: every refusal comes before any change.
func (u kubeUpgrade) plan(ctx context.Context, client kubernetes.Interface, to string) (kubeupgrade.Plan, kubeupgrade.State, error) {
	state, err := kubeupgrade.Read(ctx, client)
	if err != nil {
		return kubeupgrade.Plan{}, state, err
	}
	told := map[string]kubeupgrade.Releases{}
	var unreachable []string
	for _, n := range state.Nodes {
		r, err := u.dial(ctx, n)
		if err != nil {
			unreachable = append(unreachable, fmt.Sprintf("  %s: %v", n.Name, err))
			continue
		}
		told[n.Name] = r.Releases
		r.Close()
	}
	if len(unreachable) > 0 {
		return kubeupgrade.Plan{}, state, fmt.Errorf("%w: these nodes' upgrade services did not answer, or did not pass your check:\n%s", kubeupgrade.ErrRefused, strings.Join(unreachable, "\n"))
	}
	plan, err := kubeupgrade.MakePlan(state, to, told)
	return plan, state, err
}

// dial reaches node n's upgrade service, which must prove it is n.
func (u kubeUpgrade) dial(ctx context.Context, n kubeupgrade.Node) (*kubeupgrade.Remote, error) {
	if n.Address == "" {
		return nil, errors.New("its Node lists no internal IP")
	}
	ctx, cancel := context.WithTimeout(ctx, u.o.cluster.timeout)
	defer cancel()
	return kubeupgrade.DialNode(ctx, u.owner, n.Name, n.Address)
}

// apply backs up etcd, moves the cluster to the kubelet-serving CA if it
// is not there, then runs the plan.
func (u kubeUpgrade) apply(ctx context.Context, client kubernetes.Interface, plan kubeupgrade.Plan, state kubeupgrade.State, move servingCAMove) error {
	started := time.Now()
	say := func(format string, args ...any) { fmt.Fprintf(u.out, format+"\n", args...) }
	nodeTimeout := kubeNodeTimeout
	if u.cmd.Flags().Changed("timeout") {
		nodeTimeout = u.o.timeout
	}
	cfg := kubeupgrade.Config{
		Client: client, Say: say, NodeTimeout: nodeTimeout, DrainTimeout: kubeDrainTimeout, ReadyTimeout: kubeReadyTimeout,
		Connect: func(ctx context.Context, n kubeupgrade.Node) (kubeupgrade.NodeClient, error) { return u.dial(ctx, n) },
	}
	first := plan.Steps[0].Node
	path := filepath.Join(u.o.backupDir, time.Now().UTC().Format("20060102T150405Z"), "etcd-snapshot.db")
	size, err := kubeupgrade.BackupEtcd(ctx, cfg, first, path)
	if err != nil {
		return fmt.Errorf("%w; nothing was changed", err)
	}
	say("Backed up etcd of %s (%.1f MiB) to %s in %s ('etcdutl snapshot restore' restores it).", first.Name, float64(size)/(1<<20), path, time.Since(started).Round(time.Second))
	if move.needed() {
		if err := u.moveServingCA(ctx, client, state, nodeTimeout); err != nil {
			return err
		}
	}
	err = kubeupgrade.Run(ctx, cfg, plan)
	if err == nil {
		say("Every node runs Kubernetes %s; the upgrade took %s.", plan.To, time.Since(started).Round(time.Second))
		return nil
	}
	retry := "orrery upgrade apply --kubernetes-version " + plan.To
	var ne *kubeupgrade.NodeError
	switch {
	case ctx.Err() != nil:
		return fmt.Errorf("interrupted: a node whose upgrade had begun finishes it by itself; '%s' follows it and goes on with the rest: %w", retry, err)
	case errors.As(err, &ne):
		return fmt.Errorf("%w\nThe nodes after %s were not touched. Once its cause is fixed ('orrery logs %s' shows the node's side), '%s' retries it and goes on; the nodes already upgraded are skipped", err, ne.Node, ne.Node, retry)
	}
	return err
}

func writeKubePlan(w io.Writer, p kubeupgrade.Plan) {
	fmt.Fprintf(w, "Kubernetes: the cluster runs %s; upgrading to %s, one node at a time:\n", p.From, p.To)
	for _, s := range p.Steps {
		what := "drain, kubeadm upgrade node, kubelet, uncordon"
		switch {
		case s.Done:
			what = "runs " + p.To + " already"
		case s.Apply:
			what = "kubeadm upgrade apply (the cluster's configuration and add-ons), kubelet"
		case s.Node.ControlPlane:
			what = "kubeadm upgrade node, kubelet"
		}
		role := "worker"
		if s.Node.ControlPlane {
			role = "control plane"
		}
		fmt.Fprintf(w, "  %s (%s, kubelet %s): %s\n", s.Node.Name, role, s.Node.Kubelet, what)
	}
}
