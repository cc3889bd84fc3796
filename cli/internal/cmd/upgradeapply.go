package cmd

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/orrery-dev/orrery/internal/owner/charts"
	"github.com/orrery-dev/orrery/internal/owner/upgrade"
	"github.com/orrery-dev/orrery/internal/owner/workspace"
)

const upgradeApplyLong = `apply shows what it would change and asks (unless --yes), then:

  1. saves every custom resource definition of Orrery's and every object of
     them as YAML under --backup-dir/<UTC time>/ (crds/ and resources/, one
     file per object; 'kubectl apply -f crds/ && kubectl apply -R -f
     resources/' restores them), and stops if the disk cannot hold them;
  2. upgrades each release that changes, in order (orrery-crds, flannel,
     orrery-services), with Helm, waiting until its pods are ready; a release
     not ready within --timeout is rolled back to the revision that served
     (waiting up to --timeout again until that revision's pods are back),
     the releases after it are not touched, and apply exits non-zero naming
     it.

--measurements adds a new image's measurement set, so that nodes of either
image join and rejoin during a rollout; --retire stops accepting a set once
no node runs it ('orrery upgrade check' lists the sets and their nodes).
A set that demands weaker evidence than the strongest set the cluster
accepts (a vTPM quote alone where the nodes show SEV-SNP reports, a test
root where they show AMD's) is refused unless --allow-weaker-evidence.
A measurements file that names its own test root is always refused: only
you name one, with --snp-test-root.

A release changed by hand with helm since Orrery's last revision is not
touched without --force. Running apply again when everything is current
changes nothing. Ctrl-C during an upgrade lets Helm roll the release back
first; apply then says where each release stands.

--kubernetes-version upgrades Kubernetes instead, in place, with kubeadm's
own upgrade, to a newer patch or the next minor that every node's image
carries ('orrery upgrade check' lists them). It reaches each node's
upgrade service over attested TLS with your access key (derived from the
master secret), and refuses, before it changes anything, a downgrade, a
skipped minor, a version some node's image lacks, and a cluster with a
node that is not Ready. It then saves a snapshot of etcd under
--backup-dir, and upgrades one node at a time: the control planes first
(kubeadm upgrade apply on the first, kubeadm upgrade node on the others),
then each worker, cordoned and drained (PodDisruptionBudgets are
honoured), upgraded and uncordoned. Each node's kubelet switches to the
new release last; one that does not come up healthy goes back. A node
that fails stops the upgrade there, on its old release, and is named.
Run the same command again after an interruption (Ctrl-C, a lost
connection, a reset node): it skips the nodes that run the new release
and goes on.

A cluster made before kubelets' serving certificates had a CA of their
own (its API servers check kubelets against the cluster CA) moves to that
CA first, after the snapshot and before any version changes; the same
version the cluster runs moves it alone. Each control plane gets the same
new pair (kept in the workspace until all have it), its API server and
controller manager restart with it, then every kubelet asks for a new
serving certificate. 'kubectl logs', 'exec' and 'port-forward' to a node
fail from the first control plane's move until that node's kubelet holds
its new certificate; the command prints how long that was for each node.
The move needs the cluster's services of this orrery: run
'orrery upgrade apply' without --kubernetes-version first.`

func newUpgradeApplyCmd() *cobra.Command {
	var o upgradeApplyOptions
	c := &cobra.Command{
		Use:   "apply",
		Short: "Upgrade Orrery's releases, and add or retire accepted images",
		Long:  upgradeApplyLong,
		Example: `  orrery upgrade apply --dry-run
  orrery upgrade apply --kubernetes-version v1.37 --dry-run
  orrery upgrade apply --kubernetes-version v1.37 --yes
  orrery upgrade apply --yes --timeout 5m
  orrery upgrade apply --measurements new-image/measurements.json
  orrery upgrade apply --retire image-3f2a9c0d1e4b5a6f`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			o.workspace = workspaceDir(cmd)
			if o.backupDir == "" {
				o.backupDir = o.workspace.Path("orrery-backups")
			}
			if o.kubernetesVersion != "" {
				o.cluster.kc, o.cluster.measurements, o.cluster.hardware, o.cluster.timeout = o.kc, o.measurementsPaths, o.hardware, o.timeout
				return withUpgradeLog(o.workspace, cmd.OutOrStdout(), func(out io.Writer) error {
					return runKubernetesUpgrade(cmd, cmd.InOrStdin(), out, o)
				})
			}
			return withUpgradeLog(o.workspace, cmd.OutOrStdout(), func(out io.Writer) error {
				return runUpgradeApply(cmd.Context(), cmd.InOrStdin(), out, o)
			})
		},
	}
	f := c.Flags()
	addKubeconfigFlags(f, &o.kc)
	addKubernetesUpgradeFlags(f, &o)
	f.StringVar(&o.backupDir, "backup-dir", "", "folder that receives a backup folder per run, named after the time (default: orrery-backups in the workspace)")
	f.StringArrayVar(&o.measurementsPaths, "measurements", nil, "accept the image of this measurements.json too (repeatable); with --kubernetes-version: the images the nodes may run, which each node must prove before it is asked to upgrade (default: the image 'make image' built)")
	addHardwareFlags(f, &o.hardware)
	f.StringArrayVar(&o.retire, "retire", nil, "stop accepting this measurement set (repeatable; see 'orrery upgrade check')")
	f.DurationVar(&o.timeout, "timeout", upgrade.DefaultTimeout, "how long each release may take to become ready before it is rolled back (the rollback then waits as long again for the old revision); with --kubernetes-version: how long each node's upgrade may take (default 30m)")
	f.BoolVar(&o.dryRun, "dry-run", false, "show what would change, and change nothing")
	f.BoolVarP(&o.yes, "yes", "y", false, "do not ask for confirmation")
	f.BoolVar(&o.force, "force", false, "upgrade releases changed outside Orrery, go back to older charts, retire images nodes still run")
	f.BoolVar(&o.allowWeaker, "allow-weaker-evidence", false, "accept an image whose measurements demand weaker evidence than the cluster's strongest set: a vTPM-only set in a cluster of SEV-SNP or TDX nodes, or a set under a test root in one under AMD's roots (nodes the host could fake)")
	return c
}

func runUpgradeApply(ctx context.Context, in io.Reader, out io.Writer, o upgradeApplyOptions) error {
	if o.timeout <= 0 {
		return errors.New("--timeout must be positive")
	}
	kubeconfig, cleanup, err := o.kc.resolve(o.workspace)
	if err != nil {
		return err
	}
	defer cleanup()
	cluster, plan, err := o.plan(ctx, kubeconfig)
	if err != nil {
		return err
	}
	writePlan(out, plan)
	if !plan.Changes() {
		fmt.Fprintln(out, "Everything is current: nothing to do.")
		return nil
	}
	if o.dryRun {
		fmt.Fprintln(out, "Dry run: nothing was changed.")
		return nil
	}
	if !o.yes {
		ok, err := confirm(in, out, "Back up Orrery's custom resources and apply these changes?")
		if err != nil {
			return err
		}
		if !ok {
			fmt.Fprintln(out, "Nothing was changed.")
			return nil
		}
	}
	dir := filepath.Join(o.backupDir, time.Now().UTC().Format("20060102T150405Z"))
	if err := os.MkdirAll(o.backupDir, 0o700); err != nil {
		return fmt.Errorf("create the backup folder: %w", err)
	}
	_, outcomes, err := upgrade.Apply(ctx, upgrade.ApplyConfig{
		Helm: cluster.Helm, Client: cluster.Dynamic, Kube: cluster.Kube, BackupDir: dir, Timeout: o.timeout,
		Progress: func(msg string) { fmt.Fprintf(out, "  %s\n", msg) },
	}, plan)
	if err != nil {
		return applyFailed(ctx, out, plan, outcomes, err)
	}
	fmt.Fprintf(out, "Upgraded %d release(s). The backup is in %s.\n", len(outcomes), dir)
	return nil
}

// withUpgradeLog runs f with out copied to the workspace's upgrade log:
// the last upgrade's output stays there, for 'orrery support'. A
// workspace it cannot be written to costs only that.
func withUpgradeLog(ws workspace.Dir, out io.Writer, f func(io.Writer) error) error {
	log, err := ws.CreateLog(workspace.UpgradeLogFile)
	if err != nil {
		return f(out)
	}
	defer log.Close()
	fmt.Fprintf(log, "orrery upgrade apply at %s\n", time.Now().UTC().Format(time.RFC3339))
	err = f(io.MultiWriter(out, log))
	if err != nil {
		fmt.Fprintf(log, "Error: %v\n", err)
	}
	return err
}

// plan reads what the cluster runs and plans the upgrade the options ask
// for; it changes nothing.
func (o upgradeApplyOptions) plan(ctx context.Context, kubeconfig string) (*upgrade.Cluster, upgrade.Plan, error) {
	opts := upgrade.Options{Retire: o.retire, Force: o.force, AllowWeakerEvidence: o.allowWeaker}
	for _, p := range o.measurementsPaths {
		s, err := loadSet(p, o.hardware)
		if err != nil {
			return nil, upgrade.Plan{}, err
		}
		opts.Add = append(opts.Add, s)
	}
	cluster, err := upgrade.Connect(ctx, kubeconfig)
	if err != nil {
		return nil, upgrade.Plan{}, err
	}
	installed, err := cluster.Read()
	if err != nil {
		return nil, upgrade.Plan{}, err
	}
	if len(opts.Retire) > 0 {
		images, err := cluster.Usage(ctx)
		if err != nil {
			return nil, upgrade.Plan{}, err
		}
		opts.InUse = upgrade.InUse(images)
	}
	plan, err := upgrade.MakePlan(installed, charts.Load, opts)
	if err != nil {
		return nil, upgrade.Plan{}, fmt.Errorf("nothing was changed:\n%w", err)
	}
	return cluster, plan, nil
}

// applyFailed says where every release stands after a failed apply.
func applyFailed(ctx context.Context, out io.Writer, plan upgrade.Plan, done []upgrade.Outcome, err error) error {
	re, isRelease := upgrade.IsReleaseError(err)
	if !isRelease {
		return err
	}
	fmt.Fprintln(out, "Where the releases stand:")
	upgraded := map[string]bool{}
	for _, o := range done {
		upgraded[o.Release] = true
		fmt.Fprintf(out, "  %s: upgraded (revision %d)\n", o.Release, o.Revision)
	}
	after := false
	for _, s := range plan.Steps {
		switch {
		case upgraded[s.Ref.Name] || len(s.Changes) == 0:
		case s.Ref.Name == re.Release:
			after = true
			switch {
			case re.RolledBackTo > 0 && re.NotBack != nil:
				fmt.Fprintf(out, "  %s: rolled back to revision %d, whose pods were not all ready again within --timeout; Kubernetes goes on starting them: %v\n", s.Ref.Name, re.RolledBackTo, re.NotBack)
			case re.RolledBackTo > 0:
				fmt.Fprintf(out, "  %s: rolled back to revision %d, which serves again\n", s.Ref.Name, re.RolledBackTo)
			default:
				fmt.Fprintf(out, "  %s: not rolled back; 'helm history %s -n %s' shows its state, 'helm rollback %s -n %s' returns to its last deployed revision\n", s.Ref.Name, s.Ref.Name, s.Ref.Namespace, s.Ref.Name, s.Ref.Namespace)
			}
		case after:
			fmt.Fprintf(out, "  %s: not touched\n", s.Ref.Name)
		}
	}
	if ctx.Err() != nil {
		return fmt.Errorf("interrupted: %w", err)
	}
	return err
}

func writePlan(out io.Writer, plan upgrade.Plan) {
	for _, n := range plan.Notes {
		fmt.Fprintf(out, "Note: %s\n", n)
	}
	for _, s := range plan.Steps {
		if len(s.Changes) == 0 {
			fmt.Fprintf(out, "%s: current (chart %s)\n", s.Ref.Name, s.ToVersion)
			continue
		}
		fmt.Fprintf(out, "%s: %s\n", s.Ref.Name, strings.Join(s.Changes, "; "))
	}
}

// confirm asks a yes/no question on out and reads the answer from in.
func confirm(in io.Reader, out io.Writer, question string) (bool, error) {
	fmt.Fprintf(out, "%s [y/N] ", question)
	line, err := bufio.NewReader(in).ReadString('\n')
	if err != nil && line == "" {
		return false, errors.New("no answer on standard input: pass --yes to go ahead without asking")
	}
	switch strings.ToLower(strings.TrimSpace(line)) {
	case "y", "yes":
		return true, nil
	}
	return false, nil
}

type upgradeApplyOptions struct {
	kc                 kubeconfigOptions
	workspace          workspace.Dir
	backupDir          string
	measurementsPaths  []string
	hardware           hardwareOptions
	retire             []string
	timeout            time.Duration
	dryRun, yes, force bool
	allowWeaker        bool
	// kubernetesVersion, if set, makes apply upgrade Kubernetes, with
	// what cluster says of the nodes and the owner.
	kubernetesVersion string
	cluster           clusterOptions
}

// addKubernetesUpgradeFlags adds the flags of 'apply --kubernetes-version':
// the version, and what proves the owner to the nodes and the nodes to
// the owner.
func addKubernetesUpgradeFlags(f *pflag.FlagSet, o *upgradeApplyOptions) {
	f.StringVar(&o.kubernetesVersion, "kubernetes-version", "", "upgrade Kubernetes on every node to this version (v1.37 means its newest patch), one minor at a time; Orrery's releases are not touched")
	f.StringVar(&o.cluster.masterSecretPath, "master-secret", "", "with --kubernetes-version: the cluster's master secret, from which your access key to the nodes is derived (default: "+workspace.MasterSecretFile+" in the workspace)")
	f.StringVar(&o.cluster.platformCAPath, "platform-ca", "", "with --kubernetes-version: CA certificate that certifies the nodes' attestation keys (default: the one of 'orrery mini')")
	f.StringVar(&o.cluster.miniDir, "mini-dir", "orrery-mini", "with --kubernetes-version: state directory of 'orrery mini', for the default --platform-ca")
	f.BoolVar(&o.cluster.trustAnyAK, "insecure-trust-any-ak", false, "with --kubernetes-version: accept any attestation key (development only)")
}
