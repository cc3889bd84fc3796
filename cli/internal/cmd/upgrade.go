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
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/orrery-dev/orrery/internal/owner/charts"
	"github.com/orrery-dev/orrery/internal/owner/upgrade"
	"github.com/orrery-dev/orrery/internal/owner/workspace"
	"github.com/orrery-dev/orrery/internal/records/measurementset"
)

func newUpgradeCmd() *cobra.Command {
	c := &cobra.Command{
		Use:   "upgrade",
		Short: "Upgrade the cluster's services and change the node images it accepts",
		Long: `upgrade brings the Helm releases Orrery owns in a cluster (orrery-crds,
flannel, orrery-services; 'orrery version' lists them) to the charts this
orrery carries, and adds or retires the node images (measurement sets) the
join service accepts.

'upgrade check' tells what would change; 'upgrade apply' changes it, after
backing up Orrery's custom resources to your disk. Each release is upgraded
atomically: one whose pods do not become ready in time is rolled back by
Helm to the revision that served, and the releases after it are left alone.
The releases stay ordinary Helm releases: 'helm list', 'helm history' and
'helm rollback' work on them.`,
	}
	c.AddCommand(newUpgradeCheckCmd(), newUpgradeApplyCmd())
	return c
}

type upgradeCheckOptions struct {
	kc                kubeconfigOptions
	measurementsPaths []string
	output            string
	hardware          hardwareOptions
}

func newUpgradeCheckCmd() *cobra.Command {
	var o upgradeCheckOptions
	c := &cobra.Command{
		Use:   "check",
		Short: "Show installed and available versions, and the images the cluster accepts",
		Long: `check compares each of Orrery's releases in the cluster with the chart this
orrery carries, lists the Kubernetes versions, and lists the node images
(measurement sets) the cluster accepts with the nodes that run each. Given
--measurements (repeatable), it also tells whether the cluster accepts
each of those images.`,
		Example: `  orrery upgrade check
  orrery upgrade check --measurements new-image/measurements.json -o json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := checkOutput(o.output); err != nil {
				return err
			}
			var given []measurementset.Set
			for _, path := range o.measurementsPaths {
				s, err := loadSet(path, o.hardware)
				if err != nil {
					return err
				}
				given = append(given, s)
			}
			kubeconfig, cleanup, err := o.kc.resolve(workspaceDir(cmd))
			if err != nil {
				return err
			}
			defer cleanup()
			cluster, err := upgrade.Connect(cmd.Context(), kubeconfig)
			if err != nil {
				return err
			}
			r, err := upgrade.Check(cmd.Context(), cluster, given)
			if err != nil {
				return err
			}
			if o.output != "text" {
				return writeData(cmd.OutOrStdout(), o.output, r)
			}
			return writeCheck(cmd.OutOrStdout(), r)
		},
	}
	addKubeconfigFlags(c.Flags(), &o.kc)
	c.Flags().StringArrayVar(&o.measurementsPaths, "measurements", nil, "an image's measurements.json: tell whether the cluster accepts it (repeatable)")
	addSNPTestRootFlag(c.Flags(), &o.hardware)
	addOutputFlag(c, &o.output)
	describeOutput(c, upgrade.Report{})
	return c
}

// loadSet reads an image's measurements file as a measurement set.
func loadSet(path string, hw hardwareOptions) (measurementset.Set, error) {
	p, err := loadPolicy(path, hw)
	if err != nil {
		return measurementset.Set{}, fmt.Errorf("load measurements: %w", err)
	}
	s, err := measurementset.FromPolicy(p, "")
	if err != nil {
		return measurementset.Set{}, fmt.Errorf("measurements in %s: %w", path, err)
	}
	return s, nil
}

func writeCheck(w io.Writer, r upgrade.Report) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "RELEASE\tNAMESPACE\tINSTALLED\tAVAILABLE\tSTATUS\tUPGRADE")
	var reasons []string
	for _, rel := range r.Releases {
		installed := rel.Installed
		if installed == "" {
			installed = "-"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", rel.Name, rel.Namespace, installed, rel.Available, rel.Status, rel.Action)
		if rel.Reason != "" {
			reasons = append(reasons, rel.Name+": "+rel.Reason)
		}
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	for _, reason := range reasons {
		fmt.Fprintf(w, "  %s\n", reason)
	}
	fmt.Fprintf(w, "\nKubernetes: the cluster runs %s; this orrery's image supports %s\n", r.KubernetesVersion, strings.Join(r.KubernetesVersions, ", "))
	fmt.Fprintln(w, "\nImages the cluster accepts (measurement sets):")
	for _, img := range r.Images {
		nodes := "no node"
		if len(img.Nodes) > 0 {
			nodes = "nodes " + strings.Join(img.Nodes, ", ")
		}
		fmt.Fprintf(w, "  %s  (%s)\n", img.Set, nodes)
	}
	if len(r.Unknown) > 0 {
		fmt.Fprintf(w, "  nodes whose image is not one of these, or not recorded: %s\n", strings.Join(r.Unknown, ", "))
	}
	for _, m := range r.Measurements {
		if m.Accepted {
			fmt.Fprintf(w, "\nThe given measurements are image %s, which the cluster accepts.\n", m.Set)
		} else {
			fmt.Fprintf(w, "\nThe given measurements are image %s, which the cluster does not accept: 'orrery upgrade apply --measurements FILE' adds it.\n", m.Set)
		}
	}
	if r.UpToDate {
		fmt.Fprintln(w, "\nThe releases are current.")
	} else {
		fmt.Fprintln(w, "\nRun 'orrery upgrade apply' to upgrade (it shows the plan and asks first).")
	}
	return nil
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
}

func newUpgradeApplyCmd() *cobra.Command {
	var o upgradeApplyOptions
	c := &cobra.Command{
		Use:   "apply",
		Short: "Upgrade Orrery's releases, and add or retire accepted images",
		Long: `apply shows what it would change and asks (unless --yes), then:

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
first; apply then says where each release stands.`,
		Example: `  orrery upgrade apply --dry-run
  orrery upgrade apply --yes --timeout 5m
  orrery upgrade apply --measurements new-image/measurements.json
  orrery upgrade apply --retire image-3f2a9c0d1e4b5a6f`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			o.workspace = workspaceDir(cmd)
			return runUpgradeApply(cmd.Context(), cmd.InOrStdin(), cmd.OutOrStdout(), o)
		},
	}
	f := c.Flags()
	addKubeconfigFlags(f, &o.kc)
	f.StringVar(&o.backupDir, "backup-dir", "", "folder that receives a backup folder per run, named after the time (default: orrery-backups in the workspace)")
	f.StringArrayVar(&o.measurementsPaths, "measurements", nil, "accept the image of this measurements.json too (repeatable)")
	addSNPTestRootFlag(f, &o.hardware)
	f.StringArrayVar(&o.retire, "retire", nil, "stop accepting this measurement set (repeatable; see 'orrery upgrade check')")
	f.DurationVar(&o.timeout, "timeout", upgrade.DefaultTimeout, "how long each release may take to become ready before it is rolled back (the rollback then waits as long again for the old revision)")
	f.BoolVar(&o.dryRun, "dry-run", false, "show what would change, and change nothing")
	f.BoolVarP(&o.yes, "yes", "y", false, "do not ask for confirmation")
	f.BoolVar(&o.force, "force", false, "upgrade releases changed outside Orrery, go back to older charts, retire images nodes still run")
	f.BoolVar(&o.allowWeaker, "allow-weaker-evidence", false, "accept an image whose measurements demand weaker evidence than the cluster's strongest set: a vTPM-only set in a cluster of SEV-SNP or TDX nodes, or a set under a test root in one under AMD's roots (nodes the host could fake)")
	return c
}

func runUpgradeApply(ctx context.Context, in io.Reader, out io.Writer, o upgradeApplyOptions) (err error) {
	if o.timeout <= 0 {
		return errors.New("--timeout must be positive")
	}
	if o.backupDir == "" {
		o.backupDir = o.workspace.Path("orrery-backups")
	}
	kubeconfig, cleanup, err := o.kc.resolve(o.workspace)
	if err != nil {
		return err
	}
	defer cleanup()
	// The last upgrade's output stays in the workspace, for 'orrery
	// support'; a workspace it cannot be written to costs only that.
	if f, ferr := o.workspace.CreateLog(workspace.UpgradeLogFile); ferr == nil {
		defer f.Close()
		fmt.Fprintf(f, "orrery upgrade apply at %s\n", time.Now().UTC().Format(time.RFC3339))
		out = io.MultiWriter(out, f)
		defer func() {
			if err != nil {
				fmt.Fprintf(f, "Error: %v\n", err)
			}
		}()
	}
	opts := upgrade.Options{Retire: o.retire, Force: o.force, AllowWeakerEvidence: o.allowWeaker}
	for _, p := range o.measurementsPaths {
		s, err := loadSet(p, o.hardware)
		if err != nil {
			return err
		}
		opts.Add = append(opts.Add, s)
	}
	cluster, err := upgrade.Connect(ctx, kubeconfig)
	if err != nil {
		return err
	}
	installed, err := cluster.Read()
	if err != nil {
		return err
	}
	if len(opts.Retire) > 0 {
		images, err := cluster.Usage(ctx)
		if err != nil {
			return err
		}
		opts.InUse = upgrade.InUse(images)
	}
	plan, err := upgrade.MakePlan(installed, charts.Load, opts)
	if err != nil {
		return fmt.Errorf("nothing was changed:\n%w", err)
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
		Helm: cluster.Helm, Client: cluster.Dynamic, BackupDir: dir, Timeout: o.timeout,
		Progress: func(msg string) { fmt.Fprintf(out, "  %s\n", msg) },
	}, plan)
	if err != nil {
		return applyFailed(ctx, out, plan, outcomes, err)
	}
	fmt.Fprintf(out, "Upgraded %d release(s). The backup is in %s.\n", len(outcomes), dir)
	return nil
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
