package upgrade

import (
	"errors"
	"fmt"
	"io"
	"strings"
	"testing"
	"time"

	"helm.sh/helm/v3/pkg/chart"
	"helm.sh/helm/v3/pkg/release"
	"helm.sh/helm/v3/pkg/storage/driver"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/orrery-dev/orrery/internal/owner/services"
)

func rev(n int, version, desc string, status release.Status, values map[string]any) *release.Release {
	return &release.Release{
		Name: "flannel", Version: n, Config: values,
		Info:     &release.Info{Description: desc, Status: status},
		Chart:    &chart.Chart{Metadata: &chart.Metadata{Name: "flannel", Version: version}, Templates: []*chart.File{{Name: "templates/x.yaml", Data: []byte(version)}}},
		Manifest: "---\n# Source: x\napiVersion: apps/v1\nkind: DaemonSet\nmetadata:\n  name: kube-flannel-ds\n---\napiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: c\n",
	}
}

func TestReadRelease(t *testing.T) {
	ref := services.Owned[1]
	v := map[string]any{"podCIDR": "10.244.0.0/16"}
	hand := map[string]any{"podCIDR": "10.99.0.0/16"}
	tests := map[string]struct {
		revs     []*release.Release
		byOrrery bool
		hand     string
	}{
		"made by orrery": {[]*release.Release{rev(1, "0.2.0", "orrery init 0.2.0", release.StatusDeployed, v)}, true, ""},
		// Helm's atomic rollback after Orrery's failed upgrade: the
		// failed revision lost Orrery's description, the rollback is a
		// copy of Orrery's revision 1.
		"rolled back by helm after a failed upgrade": {[]*release.Release{
			rev(1, "0.2.0", "orrery init 0.2.0", release.StatusSuperseded, v),
			rev(2, "0.3.0", `Upgrade "flannel" failed: timed out`, release.StatusFailed, v),
			rev(3, "0.2.0", "Rollback to 1", release.StatusDeployed, v),
		}, true, ""},
		"upgraded by hand": {[]*release.Release{
			rev(2, "0.2.0", "Upgrade complete", release.StatusDeployed, hand),
			rev(1, "0.2.0", "orrery init 0.2.0", release.StatusSuperseded, v),
		}, false, "revision 2 (\"Upgrade complete\") was made outside Orrery, after Orrery's revision 1; values differ at podCIDR"},
		"another chart by hand": {[]*release.Release{
			rev(1, "0.2.0", "orrery init 0.2.0", release.StatusSuperseded, v),
			rev(2, "9.9.9", "Upgrade complete", release.StatusDeployed, v),
		}, false, "chart version 9.9.9, Orrery's was 0.2.0"},
		"installed by hand": {[]*release.Release{rev(1, "0.2.0", "Install complete", release.StatusDeployed, v)}, false, "no revision of the release was made by Orrery"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			inst, err := readRelease(ref, func(string) ([]*release.Release, error) { return tc.revs, nil })
			if err != nil {
				t.Fatal(err)
			}
			if inst.ByOrrery != tc.byOrrery || !strings.Contains(strings.Join(inst.Hand, "; "), tc.hand) {
				t.Fatalf("ByOrrery %t, Hand %q; want %t and %q", inst.ByOrrery, inst.Hand, tc.byOrrery, tc.hand)
			}
			if len(inst.Workloads) != 1 || inst.Workloads[0] != (Workload{Kind: "DaemonSet", Namespace: ref.Namespace, Name: "kube-flannel-ds"}) {
				t.Errorf("workloads %+v", inst.Workloads)
			}
		})
	}
	inst, err := readRelease(ref, func(string) ([]*release.Release, error) { return nil, driver.ErrReleaseNotFound })
	if err != nil || !inst.Missing {
		t.Fatalf("a missing release: %+v, %v", inst, err)
	}
}

// A read that the API server drops midway is asked again; an answer, even
// a refusal, is not.
func TestReadRetriesTransientFailures(t *testing.T) {
	// As client-go and Helm's secrets driver wrap a response cut short.
	dropped := fmt.Errorf("query: failed to query with labels: %w",
		fmt.Errorf("unexpected error when reading response body. Please retry. Original error: %w", io.ErrUnexpectedEOF))
	forbidden := apierrors.NewForbidden(schema.GroupResource{Resource: "secrets"}, "", errors.New("RBAC"))
	busy := apierrors.NewTooManyRequests("the API server is busy", 1)
	for _, tc := range []struct {
		name      string
		fails     []error
		wantCalls int
		wantErr   error
	}{
		{"answers", nil, 1, nil},
		{"dropped twice, then answers", []error{dropped, dropped}, 3, nil},
		{"busy, then answers", []error{busy}, 2, nil},
		{"dropped every time", []error{dropped, dropped, dropped, dropped}, 4, io.ErrUnexpectedEOF},
		{"refused", []error{forbidden}, 1, forbidden},
		{"not found", []error{driver.ErrReleaseNotFound}, 1, driver.ErrReleaseNotFound},
	} {
		t.Run(tc.name, func(t *testing.T) {
			calls := 0
			history := func(string) ([]*release.Release, error) {
				calls++
				if calls <= len(tc.fails) {
					return nil, tc.fails[calls-1]
				}
				return []*release.Release{rev(1, "0.1.0", services.DescriptionPrefix, release.StatusDeployed, nil)}, nil
			}
			revs, err := retryTransient(history, []time.Duration{0, 0, 0})("flannel")
			if calls != tc.wantCalls {
				t.Errorf("%d reads, want %d", calls, tc.wantCalls)
			}
			if tc.wantErr == nil && (err != nil || len(revs) != 1) {
				t.Fatalf("got %d revisions, %v; want the history", len(revs), err)
			}
			if tc.wantErr != nil && !errors.Is(err, tc.wantErr) {
				t.Fatalf("error %v, want %v", err, tc.wantErr)
			}
		})
	}
}
