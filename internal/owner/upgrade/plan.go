package upgrade

import (
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/Masterminds/semver/v3"
	"helm.sh/helm/v3/pkg/chart"
	"helm.sh/helm/v3/pkg/release"

	"github.com/orrery-dev/orrery/internal/owner/charts"
	"github.com/orrery-dev/orrery/internal/owner/services"
	"github.com/orrery-dev/orrery/internal/records/measurementset"
)

// setsValue is the orrery-services value that lists the accepted images.
const setsValue = "measurementSets"

// Options are what the owner asks beyond bringing the releases to the
// charts this CLI carries.
type Options struct {
	// Add are images' measurement sets to accept beside the current ones.
	Add []measurementset.Set
	// Retire names sets to accept no more.
	Retire []string
	// InUse maps a set's name to the nodes that last attested with it
	// (see Usage): a set in use is not retired without Force.
	InUse map[string][]string
	// Force upgrades releases that were changed outside Orrery (from
	// their current values), older charts over newer ones, and retires
	// sets that nodes still run.
	Force bool
	// AllowWeakerEvidence adds sets that demand weaker evidence than the
	// strongest set the cluster accepts (see measurementset.Evidence):
	// a vTPM-only set in a cluster of SEV-SNP nodes, a set under a test
	// root in one under AMD's. Without it such a set is refused: the
	// cluster would admit nodes the host can fake.
	AllowWeakerEvidence bool
}

// Step is what happens to one release.
type Step struct {
	Ref services.ReleaseRef
	// Install means the release is missing and is installed.
	Install                bool
	FromVersion, ToVersion string
	// FromRevision is the revision the step starts from (a failed
	// upgrade returns to it).
	FromRevision int
	Chart        *chart.Chart
	Values       map[string]any
	// Changes say, for the owner, what changes; none means the release
	// is current.
	Changes []string
}

// Plan is an upgrade: the releases' steps in order, and notes for the
// owner (what Force let through, what needs nothing).
type Plan struct {
	Steps []Step
	Notes []string
}

// Changes reports whether anything would change.
func (p Plan) Changes() bool {
	return slices.ContainsFunc(p.Steps, func(s Step) bool { return len(s.Changes) > 0 })
}

// MakePlan decides how installed (in services.Owned's order) becomes what
// this CLI carries with opts applied; load returns an embedded chart
// (charts.Load). It refuses, naming every reason, what it must not
// change without the owner's say.
func MakePlan(installed []Installed, load func(name string) (*chart.Chart, error), opts Options) (Plan, error) {
	var plan Plan
	var refusals []error
	setsDone := false
	for _, inst := range installed {
		c, err := load(inst.Ref.Chart)
		if err != nil {
			return Plan{}, err
		}
		step := Step{Ref: inst.Ref, Chart: c, ToVersion: c.Metadata.Version, FromVersion: inst.ChartVersion, FromRevision: inst.Revision}
		if inst.Missing {
			if inst.Ref.Chart != charts.OrreryCRDs {
				refusals = append(refusals, fmt.Errorf("release %s is not installed: this is not a cluster 'orrery init' set up, or its init did not finish (run the same 'orrery init' again)", inst.Ref.Name))
				continue
			}
			// Its chart takes no values: a cluster that predates it
			// gets it now.
			step.Install, step.Values = true, map[string]any{}
			step.Changes = []string{"install chart " + step.ToVersion}
			plan.Steps = append(plan.Steps, step)
			continue
		}
		if err := checkStatus(inst); err != nil {
			refusals = append(refusals, err)
			continue
		}
		if !inst.ByOrrery {
			if !opts.Force {
				refusals = append(refusals, fmt.Errorf("release %s was changed outside Orrery: %s; look with 'helm history %s -n %s', and run again with --force to upgrade from it as it is now",
					inst.Ref.Name, strings.Join(inst.Hand, "; "), inst.Ref.Name, inst.Ref.Namespace))
				continue
			}
			plan.Notes = append(plan.Notes, fmt.Sprintf("release %s was changed outside Orrery (%s); --force: upgrading from it as it is", inst.Ref.Name, strings.Join(inst.Hand, "; ")))
		}
		step.Values = deepCopy(inst.Values)
		switch newer, err := isNewer(inst.ChartVersion, step.ToVersion); {
		case err != nil:
			refusals = append(refusals, fmt.Errorf("release %s: %w", inst.Ref.Name, err))
			continue
		case newer && !opts.Force:
			refusals = append(refusals, fmt.Errorf("release %s has chart %s, newer than this orrery's %s: use the newer orrery (or --force to go back to %s)", inst.Ref.Name, inst.ChartVersion, step.ToVersion, step.ToVersion))
			continue
		case inst.ChartVersion != step.ToVersion:
			step.Changes = append(step.Changes, fmt.Sprintf("chart %s -> %s", inst.ChartVersion, step.ToVersion))
		case inst.ChartDigest != ChartDigest(c):
			step.Changes = append(step.Changes, fmt.Sprintf("chart content changes (both version %s: a rebuilt orrery)", step.ToVersion))
		}
		if inst.Ref.Chart == charts.OrreryServices {
			setsDone = true
			changes, notes, err := changeSets(step.Values, opts)
			if err != nil {
				refusals = append(refusals, fmt.Errorf("release %s: %w", inst.Ref.Name, err))
				continue
			}
			step.Changes = append(step.Changes, changes...)
			plan.Notes = append(plan.Notes, notes...)
		}
		plan.Steps = append(plan.Steps, step)
	}
	if !setsDone && (len(opts.Add) > 0 || len(opts.Retire) > 0) && len(refusals) == 0 {
		refusals = append(refusals, errors.New("the cluster has no orrery-services release, whose values hold the accepted images"))
	}
	if len(refusals) > 0 {
		return Plan{}, errors.Join(refusals...)
	}
	return plan, nil
}

// checkStatus refuses a release an earlier operation left half-done:
// Helm would refuse too, less clearly.
func checkStatus(inst Installed) error {
	switch inst.Status {
	case release.StatusPendingInstall, release.StatusPendingUpgrade, release.StatusPendingRollback, release.StatusUninstalling:
		return fmt.Errorf("release %s is %s: an earlier operation on it did not finish; 'helm history %s -n %s' shows its revisions, and 'helm rollback %s -n %s' returns it to its last deployed one",
			inst.Ref.Name, inst.Status, inst.Ref.Name, inst.Ref.Namespace, inst.Ref.Name, inst.Ref.Namespace)
	}
	return nil
}

// isNewer reports whether installed is a newer SemVer than ours.
func isNewer(installed, ours string) (bool, error) {
	a, err := semver.StrictNewVersion(installed)
	if err != nil {
		return false, fmt.Errorf("installed chart version %q is not SemVer", installed)
	}
	b, err := semver.StrictNewVersion(ours)
	if err != nil {
		return false, fmt.Errorf("this orrery's chart version %q is not SemVer (a build without a version: build it with 'make build')", ours)
	}
	return a.GreaterThan(b), nil
}

// changeSets adds and retires measurement sets in the orrery-services
// values, returning what changes and notes for the owner.
func changeSets(values map[string]any, opts Options) (changes, notes []string, err error) {
	sets, err := measurementset.FromValues(values[setsValue])
	if err != nil {
		return nil, nil, fmt.Errorf("the accepted images in the release's values: %w", err)
	}
	names := func() []string {
		var n []string
		for _, s := range sets {
			n = append(n, s.Name)
		}
		return n
	}
	strongest := -1
	for i, s := range sets {
		if strongest < 0 || s.Evidence() > sets[strongest].Evidence() {
			strongest = i
		}
	}
	for _, add := range opts.Add {
		if slices.Contains(names(), add.Name) {
			notes = append(notes, fmt.Sprintf("the cluster accepts image %s already", add.Name))
			continue
		}
		if strongest >= 0 && add.Evidence() < sets[strongest].Evidence() {
			have := sets[strongest]
			if !opts.AllowWeakerEvidence {
				return nil, nil, fmt.Errorf("image %s would admit nodes on weaker evidence than the cluster's: it demands %s, while image %s demands %s; "+
					"a node of it could be one the host fakes. Use the image's measurements for the cluster's hardware (measurements-sev-snp.json for SEV-SNP), or pass --allow-weaker-evidence if that is what you want",
					add.Name, add.Evidence(), have.Name, have.Evidence())
			}
			notes = append(notes, fmt.Sprintf("--allow-weaker-evidence: image %s demands %s, weaker than image %s (%s)", add.Name, add.Evidence(), have.Name, have.Evidence()))
		}
		sets = append(sets, add)
		changes = append(changes, "accept image "+add.Name)
	}
	for _, name := range opts.Retire {
		i := slices.Index(names(), name)
		if i < 0 {
			return nil, nil, fmt.Errorf("the cluster accepts no image %s; it accepts %s", name, strings.Join(names(), ", "))
		}
		if nodes := opts.InUse[name]; len(nodes) > 0 {
			if !opts.Force {
				return nil, nil, fmt.Errorf("image %s is still the image of node(s) %s, which could not rejoin after a reboot: replace them with nodes of another image first, or retire with --force", name, strings.Join(nodes, ", "))
			}
			notes = append(notes, fmt.Sprintf("--force: retiring image %s that node(s) %s still run", name, strings.Join(nodes, ", ")))
		}
		sets = slices.Delete(sets, i, i+1)
		changes = append(changes, "stop accepting image "+name)
	}
	if len(sets) == 0 {
		return nil, nil, errors.New("retiring every accepted image would let no node join or rejoin: add the new image's measurements (--measurements) in the same run")
	}
	var list []any
	for _, s := range sets {
		v, err := s.Values()
		if err != nil {
			return nil, nil, err
		}
		list = append(list, v)
	}
	values[setsValue] = list
	return changes, notes, nil
}

// DiffKeys lists the top-level keys whose values differ between a and b,
// sorted.
func DiffKeys(a, b map[string]any) []string {
	var out []string
	for _, k := range slices.Sorted(maps.Keys(merge(a, b))) {
		ja, _ := json.Marshal(a[k])
		jb, _ := json.Marshal(b[k])
		if string(ja) != string(jb) {
			out = append(out, k)
		}
	}
	return out
}

func merge(a, b map[string]any) map[string]any {
	out := maps.Clone(a)
	if out == nil {
		out = map[string]any{}
	}
	maps.Copy(out, b)
	return out
}

// deepCopy copies JSON-shaped values, so a plan never changes what Read
// returned.
func deepCopy(v map[string]any) map[string]any {
	raw, err := json.Marshal(v)
	if err != nil {
		return map[string]any{}
	}
	out := map[string]any{}
	_ = json.Unmarshal(raw, &out)
	return out
}
