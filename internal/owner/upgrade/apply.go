package upgrade

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"helm.sh/helm/v3/pkg/action"
	"helm.sh/helm/v3/pkg/release"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"

	"github.com/orrery-dev/orrery/internal/owner/backup"
	"github.com/orrery-dev/orrery/internal/owner/services"
	"github.com/orrery-dev/orrery/internal/records/orreryapi"
)

// ApplyConfig is what Apply needs besides the plan.
type ApplyConfig struct {
	// Helm connects Helm for a namespace (services.HelmConfig).
	Helm func(namespace string) (*action.Configuration, error)
	// Client reads the custom resources to back up.
	Client dynamic.Interface
	// Kube creates the removed-node list where it is missing.
	Kube kubernetes.Interface
	// BackupDir is the folder the backup goes to; it must not exist.
	BackupDir string
	// CRDs are the definitions to back up with all their objects;
	// Orrery's own if nil.
	CRDs []string
	// Timeout bounds each release's upgrade, its wait for readiness
	// included; a release not ready by then is rolled back. Zero means
	// DefaultTimeout: a zero wait would roll back every release.
	Timeout time.Duration
	// Progress receives a line per step.
	Progress func(msg string)
}

// DefaultTimeout is how long a release may take to become ready when
// ApplyConfig says nothing: under TCG a control plane's pods take a minute
// or two to start.
const DefaultTimeout = 5 * time.Minute

// Outcome is what happened to one release.
type Outcome struct {
	Release  string
	Revision int
	Duration time.Duration
}

// ReleaseError is a release's failed upgrade; RolledBackTo is the revision
// the release was rolled back to (0 if the rollback did not happen or
// failed too). NotBack, when set, says why that revision's pods were not
// all ready again within the timeout: the rollback is done, and
// Kubernetes goes on starting them.
type ReleaseError struct {
	Release      string
	RolledBackTo int
	NotBack      error
	Err          error
}

func (e *ReleaseError) Error() string {
	switch {
	case e.RolledBackTo > 0 && e.NotBack != nil:
		return fmt.Sprintf("release %s failed: %v; rolled back to revision %d, whose pods are not back yet: %v", e.Release, e.Err, e.RolledBackTo, e.NotBack)
	case e.RolledBackTo > 0:
		return fmt.Sprintf("release %s failed and was rolled back to revision %d, which serves again: %v", e.Release, e.RolledBackTo, e.Err)
	case e.NotBack != nil:
		return fmt.Sprintf("release %s failed: %v; after the rollback its pods are not back yet: %v", e.Release, e.Err, e.NotBack)
	}
	return fmt.Sprintf("release %s failed: %v", e.Release, e.Err)
}

func (e *ReleaseError) Unwrap() error { return e.Err }

// Apply backs up Orrery's custom resources and then upgrades the releases
// that change, in the plan's order, each atomically (Helm waits for
// readiness and rolls back a release that does not get there). It stops
// at the first failure, leaving the releases after it as they were. A
// plan without changes does nothing, not even the backup.
func Apply(ctx context.Context, cfg ApplyConfig, plan Plan) (backup.Result, []Outcome, error) {
	if !plan.Changes() {
		return backup.Result{}, nil, nil
	}
	if cfg.Progress == nil {
		cfg.Progress = func(string) {}
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = DefaultTimeout
	}
	crds := cfg.CRDs
	if crds == nil {
		crds = orreryapi.CRDNames
	}
	saved, err := backup.Save(ctx, cfg.Client, crds, cfg.BackupDir)
	if err != nil {
		return saved, nil, fmt.Errorf("back up Orrery's custom resources (nothing was upgraded): %w", err)
	}
	say(cfg, "backed up %d custom resource definitions and %d custom resources to %s", saved.CRDs, saved.Resources, saved.Dir)
	// A cluster initialised before 'orrery init' made the removed-node
	// list has the admission policy that reads it on every write, and
	// pays a lookup for each while it is missing (see
	// services.EnsureRemovedNodesList).
	if err := services.EnsureRemovedNodesList(ctx, cfg.Kube); err != nil {
		return saved, nil, fmt.Errorf("%w (nothing was upgraded)", err)
	}
	var outcomes []Outcome
	for _, step := range plan.Steps {
		if len(step.Changes) == 0 {
			continue
		}
		start := time.Now()
		say(cfg, "upgrading %s (%s)", step.Ref.Name, strings.Join(step.Changes, "; "))
		rev, err := applyStep(ctx, cfg, step)
		if err != nil {
			return saved, outcomes, err
		}
		o := Outcome{Release: step.Ref.Name, Revision: rev, Duration: time.Since(start)}
		outcomes = append(outcomes, o)
		say(cfg, "%s upgraded to revision %d (%s)", o.Release, o.Revision, o.Duration.Round(time.Second))
	}
	return saved, outcomes, nil
}

func applyStep(ctx context.Context, cfg ApplyConfig, step Step) (int, error) {
	hc, err := cfg.Helm(step.Ref.Namespace)
	if err != nil {
		return 0, err
	}
	start := time.Now()
	deadline := start.Add(cfg.Timeout)
	var rel *release.Release
	if step.Install {
		in := action.NewInstall(hc)
		in.ReleaseName, in.Namespace = step.Ref.Name, step.Ref.Namespace
		in.Wait, in.Timeout, in.Atomic = true, cfg.Timeout, true
		in.Description = services.Description("upgrade")
		rel, err = in.RunWithContext(ctx, step.Chart, step.Values)
	} else {
		up := action.NewUpgrade(hc)
		up.Namespace = step.Ref.Namespace
		up.Wait, up.Timeout = true, cfg.Timeout
		// A release whose objects do not become ready returns to the
		// revision that served, and objects the failed revision added
		// are removed.
		up.Atomic, up.CleanupOnFail = true, true
		up.Description = services.Description("upgrade")
		rel, err = up.RunWithContext(ctx, step.Ref.Name, step.Chart, step.Values)
	}
	if err != nil {
		// Helm's atomic upgrade has rolled back by itself.
		say(cfg, "%s: Helm's upgrade failed after %s; Helm rolled it back", step.Ref.Name, time.Since(start).Round(time.Second))
		return 0, &ReleaseError{Release: step.Ref.Name, RolledBackTo: rolledBackTo(hc, step), Err: err}
	}
	say(cfg, "%s: revision %d deployed by Helm after %s; waiting for every pod of it", step.Ref.Name, rel.Version, time.Since(start).Round(time.Second))
	// Helm's wait is too lenient for DaemonSets (see awaitRollout).
	wctx, cancel := context.WithDeadline(ctx, deadline)
	defer cancel()
	if err := awaitRollout(wctx, cfg.Client, rel.Manifest, step.Ref.Namespace); err != nil {
		say(cfg, "%s: its pods were not all ready %s after the upgrade began; taking it back", step.Ref.Name, time.Since(start).Round(time.Second))
		return 0, undo(hc, cfg, step, err)
	}
	return rel.Version, nil
}

// say reports a step of the upgrade; of a failed release it says where
// the time went. Apply has set cfg.Progress.
func say(cfg ApplyConfig, format string, args ...any) {
	cfg.Progress(fmt.Sprintf(format, args...))
}

// undo takes back a revision that Helm deployed but whose pods did not
// all become ready: it rolls the release back to the revision that
// served, or uninstalls a release that did not exist before, as Helm's
// atomic upgrade does with the failures it sees. It runs to its end even
// when the owner interrupted: an interrupt must not leave a release
// half-applied.
func undo(hc *action.Configuration, cfg ApplyConfig, step Step, cause error) error {
	if step.Install {
		un := action.NewUninstall(hc)
		un.Wait, un.Timeout = true, cfg.Timeout
		if _, err := un.Run(step.Ref.Name); err != nil {
			cause = fmt.Errorf("%w; uninstalling it failed too: %v", cause, err)
		}
		return &ReleaseError{Release: step.Ref.Name, Err: cause}
	}
	rb := action.NewRollback(hc)
	rb.Version, rb.CleanupOnFail = step.FromRevision, true
	start := time.Now()
	if err := rb.Run(step.Ref.Name); err != nil {
		return &ReleaseError{Release: step.Ref.Name, Err: fmt.Errorf("%w; the rollback to revision %d failed too: %v", cause, step.FromRevision, err)}
	}
	say(cfg, "%s: Helm took it back to revision %d in %s; waiting up to %s for its pods", step.Ref.Name, step.FromRevision, time.Since(start).Round(time.Second), cfg.Timeout)
	// The rollback is done once the old revision's pods are back, by the
	// same measure as the upgrade.
	ctx, cancel := context.WithTimeout(context.Background(), cfg.Timeout)
	defer cancel()
	// A loaded machine may need longer than the timeout to start them
	// (seen under hack/stress-e2e.sh): the release is rolled back all
	// the same, and the owner is told that its pods are still starting.
	var notBack error
	if cur, err := action.NewGet(hc).Run(step.Ref.Name); err == nil {
		notBack = awaitRollout(ctx, cfg.Client, cur.Manifest, step.Ref.Namespace)
	}
	return &ReleaseError{Release: step.Ref.Name, RolledBackTo: rolledBackTo(hc, step), NotBack: notBack, Err: cause}
}

// rolledBackTo is the revision the release serves after a failed upgrade
// from step.FromRevision: Helm's rollback makes a new revision that is a
// copy of it. 0 if the release is not deployed again.
func rolledBackTo(hc *action.Configuration, step Step) int {
	if step.Install {
		return 0
	}
	revs, err := action.NewHistory(hc).Run(step.Ref.Name)
	if err != nil || len(revs) == 0 {
		return 0
	}
	last := slices.MaxFunc(revs, func(a, b *release.Release) int { return a.Version - b.Version })
	if last.Info == nil || last.Info.Status != release.StatusDeployed || last.Version <= step.FromRevision {
		return 0
	}
	return step.FromRevision
}

// IsReleaseError reports whether err is a release's failed upgrade, and
// returns it.
func IsReleaseError(err error) (*ReleaseError, bool) {
	var re *ReleaseError
	ok := errors.As(err, &re)
	return re, ok
}
