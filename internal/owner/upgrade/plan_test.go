package upgrade

import (
	"bytes"
	"slices"
	"strings"
	"testing"

	"helm.sh/helm/v3/pkg/release"

	"github.com/orrery-dev/orrery/internal/attestation/measurements"
	"github.com/orrery-dev/orrery/internal/attestation/policy"
	"github.com/orrery-dev/orrery/internal/attestation/snp"
	"github.com/orrery-dev/orrery/internal/attestation/snp/snpsim"
	"github.com/orrery-dev/orrery/internal/attestation/tee"
	"github.com/orrery-dev/orrery/internal/owner/charts"
	"github.com/orrery-dev/orrery/internal/owner/services"
	"github.com/orrery-dev/orrery/internal/records/measurementset"
)

// installedAt is every release at version, made by Orrery, accepting sets.
func installedAt(t *testing.T, version string, sets ...measurementset.Set) []Installed {
	t.Helper()
	var list []any
	for _, s := range sets {
		v, err := s.Values()
		if err != nil {
			t.Fatal(err)
		}
		list = append(list, v)
	}
	var out []Installed
	for _, ref := range services.Owned {
		inst := Installed{Ref: ref, Revision: 1, Status: release.StatusDeployed, ChartVersion: version, ByOrrery: true, Values: map[string]any{}}
		if ref.Chart == charts.OrreryServices {
			inst.Values["measurementSets"] = list
		}
		out = append(out, inst)
	}
	return out
}

func TestPlanRefusals(t *testing.T) {
	a, b := testSet(t, 1), testSet(t, 3)
	load := testCharts(t, "0.2.1", false)
	tests := map[string]struct {
		installed []Installed
		opts      Options
		want      string
	}{
		"retire an unknown set": {installedAt(t, "0.2.1", a), Options{Retire: []string{"image-0000000000000000"}},
			"accepts no image image-0000000000000000; it accepts " + a.Name},
		"retire a set nodes run": {installedAt(t, "0.2.1", a, b), Options{Retire: []string{a.Name}, InUse: map[string][]string{a.Name: {"worker-0"}}},
			"still the image of node(s) worker-0"},
		"retire the last set": {installedAt(t, "0.2.1", a), Options{Retire: []string{a.Name}}, "would let no node join"},
		"a newer chart installed": {installedAt(t, "0.3.0", a), Options{},
			"chart 0.3.0, newer than this orrery's 0.2.1"},
		"an interrupted upgrade": {func() []Installed {
			i := installedAt(t, "0.2.0", a)
			i[1].Status = release.StatusPendingUpgrade
			return i
		}(), Options{}, "flannel is pending-upgrade"},
		"no orrery-services": {func() []Installed {
			i := installedAt(t, "0.2.0", a)
			i[2] = Installed{Ref: i[2].Ref, Missing: true}
			return i
		}(), Options{}, "orrery-services is not installed"},
		"sets in the values edited by hand": {func() []Installed {
			i := installedAt(t, "0.2.1", a)
			v := i[2].Values["measurementSets"].([]any)[0].(map[string]any)
			v["name"] = "image-ffffffffffffffff"
			return i
		}(), Options{}, "its measurements were changed after it was named"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			_, err := MakePlan(tc.installed, load, tc.opts)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want %q", err, tc.want)
			}
		})
	}
}

func TestPlanCases(t *testing.T) {
	a, b := testSet(t, 1), testSet(t, 3)
	load := testCharts(t, "0.2.1", false)

	// --force lets a set that nodes run be retired, and says so.
	p, err := MakePlan(installedAt(t, "0.2.1", a, b), load, Options{Retire: []string{a.Name}, InUse: map[string][]string{a.Name: {"worker-0"}}, Force: true})
	if err != nil || len(p.Notes) != 1 || !strings.Contains(p.Notes[0], "worker-0") {
		t.Fatalf("forced retire: %v, notes %v", err, p.Notes)
	}

	// Adding a set the cluster has is no change, with a note.
	p, err = MakePlan(installedAt(t, "0.2.1", a), load, Options{Add: []measurementset.Set{a}})
	if err != nil || len(p.Notes) != 1 {
		t.Fatalf("add an accepted set: %v, notes %v", err, p.Notes)
	}
	// The chart's content is compared as well as its version; a test
	// release has no digest, so every release shows the rebuilt chart.
	for _, s := range p.Steps {
		if len(s.Changes) != 1 || !strings.Contains(s.Changes[0], "chart content changes") {
			t.Errorf("%s: changes %v", s.Ref.Name, s.Changes)
		}
	}

	// A cluster from before orrery-crds existed gets it installed.
	old := installedAt(t, "0.2.1", a)
	old[0] = Installed{Ref: old[0].Ref, Missing: true}
	p, err = MakePlan(old, load, Options{})
	if err != nil || !p.Steps[0].Install {
		t.Fatalf("missing orrery-crds: %v, %+v", err, p.Steps)
	}

	// The plan never changes what it was given.
	in := installedAt(t, "0.2.1", a)
	if _, err := MakePlan(in, load, Options{Add: []measurementset.Set{b}}); err != nil {
		t.Fatal(err)
	}
	if n := len(in[2].Values["measurementSets"].([]any)); n != 1 {
		t.Errorf("MakePlan changed the installed values: %d sets", n)
	}
}

// hardwareSet is an SEV-SNP image's set, under AMD's roots or, with a
// chip, under its test root.
func hardwareSet(t *testing.T, b byte, chip *snpsim.Chip) measurementset.Set {
	t.Helper()
	pol := &snp.Policy{Measurement: &tee.Expected{Expected: bytes.Repeat([]byte{b}, 48)}}
	if chip != nil {
		root := chip.TestRoot()
		pol.TestRoot = &root
	}
	p := policy.Policy{PCRs: measurements.M{4: {Expected: bytes.Repeat([]byte{b}, 32)}}, SEVSNP: pol}
	s, err := measurementset.FromPolicy(p, "")
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// TestPlanRefusesWeakerEvidence: an upgrade must not quietly let a cluster
// of SEV-SNP nodes admit nodes on a vTPM quote alone (the host controls
// the vTPM), nor a cluster under AMD's roots admit nodes under a test
// root (its keys sign any report).
func TestPlanRefusesWeakerEvidence(t *testing.T) {
	chip, err := snpsim.NewChip(snpsim.Config{})
	if err != nil {
		t.Fatal(err)
	}
	amd, amdNext := hardwareSet(t, 1, nil), hardwareSet(t, 2, nil)
	test, testNext := hardwareSet(t, 3, chip), hardwareSet(t, 4, chip)
	vtpm := testSet(t, 5)
	load := testCharts(t, "0.2.1", false)
	for name, tc := range map[string]struct {
		cluster []measurementset.Set
		add     measurementset.Set
		refused bool
	}{
		"vTPM set into an SEV-SNP cluster":           {[]measurementset.Set{amd}, vtpm, true},
		"vTPM set into a test-root cluster":          {[]measurementset.Set{test}, vtpm, true},
		"test-root set into a cluster under AMD's":   {[]measurementset.Set{amd}, test, true},
		"weaker than the strongest of two sets":      {[]measurementset.Set{test, amd}, testNext, true},
		"SEV-SNP set into an SEV-SNP cluster":        {[]measurementset.Set{amd}, amdNext, false},
		"test-root set into a test-root cluster":     {[]measurementset.Set{test}, testNext, false},
		"SEV-SNP set into a vTPM cluster (stronger)": {[]measurementset.Set{vtpm}, amd, false},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := MakePlan(installedAt(t, "0.2.1", tc.cluster...), load, Options{Add: []measurementset.Set{tc.add}})
			if !tc.refused {
				if err != nil {
					t.Fatalf("refused: %v", err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), "weaker evidence") || !strings.Contains(err.Error(), "--allow-weaker-evidence") {
				t.Fatalf("err = %v, want a refusal naming --allow-weaker-evidence", err)
			}
			p, err := MakePlan(installedAt(t, "0.2.1", tc.cluster...), load, Options{Add: []measurementset.Set{tc.add}, AllowWeakerEvidence: true})
			if err != nil || !slices.ContainsFunc(p.Notes, func(n string) bool { return strings.Contains(n, "--allow-weaker-evidence") }) {
				t.Fatalf("with --allow-weaker-evidence: %v, notes %v", err, p)
			}
		})
	}
}
