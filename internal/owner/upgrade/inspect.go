// Package upgrade upgrades the Helm releases Orrery owns in a cluster
// (services.Owned) to the charts this CLI carries, and changes the images
// the cluster accepts (measurement sets): it reads what is installed
// (Read), decides what would change (MakePlan, which refuses what it must
// not touch), and applies that after backing up Orrery's custom resources
// (Apply), one release after another, each atomically.
package upgrade

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"slices"
	"strings"
	"syscall"
	"time"

	"helm.sh/helm/v3/pkg/action"
	"helm.sh/helm/v3/pkg/chart"
	"helm.sh/helm/v3/pkg/release"
	"helm.sh/helm/v3/pkg/releaseutil"
	"helm.sh/helm/v3/pkg/storage/driver"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/yaml"

	"github.com/orrery-dev/orrery/internal/owner/services"
)

// Installed is one of Orrery's releases as the cluster has it.
type Installed struct {
	Ref services.ReleaseRef
	// Missing means the cluster has no such release (set up by an
	// Orrery that did not have the chart yet); an upgrade installs it.
	Missing bool
	// Revision, Status, ChartVersion and Description are the latest
	// revision's.
	Revision     int
	Status       release.Status
	ChartVersion string
	Description  string
	// Values are the values the latest revision was installed with (the
	// user-supplied ones, not the chart's defaults).
	Values map[string]any
	// ChartDigest identifies the chart's content (templates, default
	// values, version), to tell a rebuilt chart of the same version.
	ChartDigest string
	// ByOrrery means the latest revision has the chart and values of a
	// revision Orrery made: Orrery made it, or it is a rollback to one
	// (Helm's own after a failed upgrade, or the owner's 'helm
	// rollback'), and an upgrade loses nothing made by hand. If not, Hand
	// says what differs from Orrery's last revision.
	ByOrrery bool
	Hand     []string
	// Workloads are the latest revision's Deployments and DaemonSets.
	Workloads []Workload
}

// Workload is a Deployment or DaemonSet of a release.
type Workload struct {
	Kind, Namespace, Name string
}

// historyReader is what Read needs of Helm: action.History's Run.
type historyReader func(name string) ([]*release.Release, error)

// Read returns the state of every release Orrery owns. config connects
// Helm for a namespace (services.HelmConfig).
func Read(config func(namespace string) (*action.Configuration, error)) ([]Installed, error) {
	var out []Installed
	for _, ref := range services.Owned {
		cfg, err := config(ref.Namespace)
		if err != nil {
			return nil, err
		}
		inst, err := readRelease(ref, retryTransient(action.NewHistory(cfg).Run, readPauses))
		if err != nil {
			return nil, err
		}
		out = append(out, inst)
	}
	return out, nil
}

// readPauses are the pauses before Read asks for a release's history
// again after a transient failure: an API server short of CPU drops a
// response midway ("unexpected EOF"), or times out, and answers again
// seconds later (23 s after one such drop in a TCG run).
var readPauses = []time.Duration{2 * time.Second, 5 * time.Second, 10 * time.Second, 20 * time.Second}

// retryTransient reads the history again after each pause for as long as
// the read fails in a way that another attempt can mend. It only reads, so
// asking again changes nothing.
func retryTransient(history historyReader, pauses []time.Duration) historyReader {
	return func(name string) ([]*release.Release, error) {
		revs, err := history(name)
		for _, p := range pauses {
			if !transient(err) {
				break
			}
			time.Sleep(p)
			revs, err = history(name)
		}
		return revs, err
	}
}

// transient reports whether err is the API server or the connection to
// it failing for the moment, not an answer.
func transient(err error) bool {
	if err == nil {
		return false
	}
	var netErr net.Error
	return errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, io.EOF) ||
		errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.ECONNREFUSED) ||
		(errors.As(err, &netErr) && netErr.Timeout()) ||
		apierrors.IsServerTimeout(err) || apierrors.IsTimeout(err) || apierrors.IsTooManyRequests(err) ||
		apierrors.IsServiceUnavailable(err) || apierrors.IsInternalError(err)
}

func readRelease(ref services.ReleaseRef, history historyReader) (Installed, error) {
	revs, err := history(ref.Name)
	if errors.Is(err, driver.ErrReleaseNotFound) || (err == nil && len(revs) == 0) {
		return Installed{Ref: ref, Missing: true}, nil
	}
	if err != nil {
		return Installed{}, fmt.Errorf("read the history of release %s/%s: %w", ref.Namespace, ref.Name, err)
	}
	slices.SortFunc(revs, func(a, b *release.Release) int { return a.Version - b.Version })
	last := revs[len(revs)-1]
	inst := Installed{
		Ref:      ref,
		Revision: last.Version,
		Values:   last.Config,
		ByOrrery: sameAsOrrerys(revs, last),
	}
	if last.Info != nil {
		inst.Status, inst.Description = last.Info.Status, last.Info.Description
	}
	if last.Chart != nil && last.Chart.Metadata != nil {
		inst.ChartVersion = last.Chart.Metadata.Version
		inst.ChartDigest = ChartDigest(last.Chart)
	}
	if !inst.ByOrrery {
		inst.Hand = handChanges(revs)
	}
	inst.Workloads = workloads(last.Manifest, ref.Namespace)
	return inst, nil
}

// byOrrery reports whether Orrery made revision r. A revision whose
// upgrade failed has lost the mark: Helm replaces its description with
// the failure.
func byOrrery(r *release.Release) bool {
	return r.Info != nil && strings.HasPrefix(r.Info.Description, services.DescriptionPrefix)
}

// sameAsOrrerys reports whether last has the chart and values of a
// revision Orrery made.
func sameAsOrrerys(revs []*release.Release, last *release.Release) bool {
	for _, r := range revs {
		if byOrrery(r) && ChartDigest(r.Chart) == ChartDigest(last.Chart) && len(DiffKeys(r.Config, last.Config)) == 0 {
			return true
		}
	}
	return false
}

// handChanges says how the latest revision differs from the last one
// Orrery made; revs are sorted by revision.
func handChanges(revs []*release.Release) []string {
	last := revs[len(revs)-1]
	var base *release.Release
	for _, r := range slices.Backward(revs) {
		if byOrrery(r) {
			base = r
			break
		}
	}
	what := fmt.Sprintf("revision %d (%q) was made outside Orrery", last.Version, description(last))
	if base == nil {
		return []string{what + ", and no revision of the release was made by Orrery"}
	}
	out := []string{fmt.Sprintf("%s, after Orrery's revision %d", what, base.Version)}
	if v1, v2 := chartVersion(base), chartVersion(last); v1 != v2 {
		out = append(out, fmt.Sprintf("chart version %s, Orrery's was %s", v2, v1))
	} else if ChartDigest(base.Chart) != ChartDigest(last.Chart) {
		out = append(out, "the chart's content differs from Orrery's")
	}
	if keys := DiffKeys(base.Config, last.Config); len(keys) > 0 {
		out = append(out, "values differ at "+strings.Join(keys, ", "))
	}
	return out
}

func description(r *release.Release) string {
	if r.Info == nil {
		return ""
	}
	return r.Info.Description
}

func chartVersion(r *release.Release) string {
	if r.Chart == nil || r.Chart.Metadata == nil {
		return ""
	}
	return r.Chart.Metadata.Version
}

// ChartDigest is a digest of what decides a chart's objects: its version,
// templates and default values.
func ChartDigest(c *chart.Chart) string {
	if c == nil {
		return ""
	}
	h := sha256.New()
	if c.Metadata != nil {
		fmt.Fprintf(h, "version %q app %q\n", c.Metadata.Version, c.Metadata.AppVersion)
	}
	templates := slices.Clone(c.Templates)
	slices.SortFunc(templates, func(a, b *chart.File) int { return strings.Compare(a.Name, b.Name) })
	for _, t := range templates {
		fmt.Fprintf(h, "template %q %d\n", t.Name, len(t.Data))
		h.Write(t.Data)
	}
	// The parsed defaults, not values.yaml: a stored release keeps only
	// those (and encoding/json writes map keys in order).
	values, err := json.Marshal(c.Values)
	if err != nil {
		values = []byte(err.Error())
	}
	fmt.Fprintf(h, "values %d\n", len(values))
	h.Write(values)
	return hex.EncodeToString(h.Sum(nil))
}

// workloads lists the Deployments and DaemonSets of a release manifest;
// objects without a namespace are in the release's.
func workloads(manifest, namespace string) []Workload {
	var out []Workload
	for _, doc := range releaseutil.SplitManifests(manifest) {
		var head struct {
			Kind     string `json:"kind"`
			Metadata struct {
				Name      string `json:"name"`
				Namespace string `json:"namespace"`
			} `json:"metadata"`
		}
		if err := yaml.Unmarshal([]byte(doc), &head); err != nil {
			continue
		}
		if head.Kind != "Deployment" && head.Kind != "DaemonSet" {
			continue
		}
		ns := head.Metadata.Namespace
		if ns == "" {
			ns = namespace
		}
		out = append(out, Workload{Kind: head.Kind, Namespace: ns, Name: head.Metadata.Name})
	}
	slices.SortFunc(out, func(a, b Workload) int { return strings.Compare(a.Kind+"/"+a.Name, b.Kind+"/"+b.Name) })
	return out
}
