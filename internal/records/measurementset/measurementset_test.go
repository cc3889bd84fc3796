package measurementset

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"

	"github.com/orrery-dev/orrery/internal/attestation/measurements"
	"github.com/orrery-dev/orrery/internal/attestation/policy"
	"github.com/orrery-dev/orrery/internal/attestation/variant"
)

func m(b byte, warnOnly bool) measurements.M {
	return measurements.M{4: {Expected: bytes.Repeat([]byte{b}, 32), WarnOnly: warnOnly}, 11: {Expected: bytes.Repeat([]byte{b + 1}, 32)}}
}

func TestNameFollowsMeasurements(t *testing.T) {
	a, err := New(m(1, false), "v1")
	if err != nil {
		t.Fatal(err)
	}
	again, _ := New(m(1, false), "another description")
	other, _ := New(m(2, false), "v1")
	if a.Name != again.Name || a.Name == other.Name || !strings.HasPrefix(a.Name, "image-") || len(a.Name) != len("image-")+16 {
		t.Fatalf("names %q %q %q", a.Name, again.Name, other.Name)
	}
	// Through the chart's values and back.
	v, err := a.Values()
	if err != nil {
		t.Fatal(err)
	}
	raw, _ := json.Marshal([]any{v})
	var generic any
	_ = json.Unmarshal(raw, &generic)
	got, err := FromValues(generic)
	if err != nil || len(got) != 1 || got[0].Name != a.Name || got[0].Description != "v1" || !got[0].Measurements.Equal(a.Measurements) {
		t.Fatalf("FromValues = %+v, %v", got, err)
	}
}

func TestRefusals(t *testing.T) {
	if _, err := New(measurements.M{4: {Expected: bytes.Repeat([]byte{1}, 32), WarnOnly: true}}, ""); err == nil || !strings.Contains(err.Error(), "enforce no PCR") {
		t.Errorf("a set of warnOnly values: %v", err)
	}
	if _, err := New(measurements.M{}, ""); err == nil {
		t.Error("an empty set was accepted")
	}
	if _, err := New(m(1, false), strings.Repeat("x", 300)); err == nil {
		t.Error("an oversized description was accepted")
	}
	a, _ := New(m(1, false), "")
	v, _ := a.Values()
	v["name"] = "image-0000000000000000"
	if _, err := FromValues([]any{v}); err == nil || !strings.Contains(err.Error(), "changed after it was named") {
		t.Errorf("a set under another name: %v", err)
	}
}

func list(items ...string) []byte {
	return []byte(`{"apiVersion":"orrery.dev/v1alpha1","kind":"MeasurementSetList","items":[` + strings.Join(items, ",") + `]}`)
}

func item(t *testing.T, s Set) string {
	t.Helper()
	raw, err := s.Measurements.MarshalJSON()
	if err != nil {
		t.Fatal(err)
	}
	return `{"metadata":{"name":"` + s.Name + `"},"spec":{"measurements":` + string(raw) + `}}`
}

func TestParseList(t *testing.T) {
	a, _ := New(m(1, false), "")
	b, _ := New(m(3, false), "")
	bad := `{"metadata":{"name":"image-bad"},"spec":{"measurements":{"4":{"expected":"00"}}}}`
	sets, err := ParseList(list(item(t, b), bad, item(t, a)))
	if len(sets) != 2 || err == nil || !strings.Contains(err.Error(), "image-bad") {
		t.Fatalf("ParseList = %v, %v: want the two good sets and the bad one named", sets, err)
	}
	if sets[0].Name > sets[1].Name {
		t.Error("sets not sorted by name")
	}
	if _, err := ParseList([]byte(`{"kind":"ConfigMapList","items":[]}`)); err == nil {
		t.Error("a list of another kind was accepted")
	}
	var many []string
	for range maxSets + 1 {
		many = append(many, item(t, a))
	}
	if _, err := ParseList(list(many...)); err == nil {
		t.Error("an oversized list was accepted")
	}
}

func FuzzParseList(f *testing.F) {
	a, _ := New(m(1, false), "")
	raw, _ := a.Measurements.MarshalJSON()
	f.Add(list(`{"metadata":{"name":"` + a.Name + `"},"spec":{"measurements":` + string(raw) + `}}`))
	f.Add([]byte(`{"kind":"MeasurementSetList","items":[{}]}`))
	f.Fuzz(func(t *testing.T, body []byte) {
		sets, _ := ParseList(body)
		for _, s := range sets {
			again, err := New(s.Measurements, s.Description)
			if err != nil || again.Name != s.Name {
				t.Fatalf("ParseList returned a set New refuses or names otherwise: %+v (%v)", s, err)
			}
		}
	})
}

func TestSetWithAnSEVSNPSection(t *testing.T) {
	p, err := policy.ParseJSON([]byte(`{"4":{"expected":"` + strings.Repeat("04", 32) + `"},"sevSnp":{"measurement":{"expected":"` + strings.Repeat("6f", 48) + `"}}}`))
	if err != nil {
		t.Fatal(err)
	}
	s, err := FromPolicy(p, "snp image")
	if err != nil {
		t.Fatal(err)
	}
	plain, _ := New(p.PCRs, "snp image")
	if s.Name == plain.Name {
		t.Fatal("the SEV-SNP section does not change the set's name: two policies would share one")
	}
	v, err := s.Values()
	if err != nil {
		t.Fatal(err)
	}
	back, err := FromValues([]any{v})
	if err != nil {
		t.Fatalf("the set's own values do not read back: %v", err)
	}
	if back[0].Name != s.Name || back[0].SEVSNP == nil || back[0].Policy().Variant() != variant.GCPSEVSNP {
		t.Fatalf("read back %+v", back[0])
	}
	// The API server's form: the section in the spec beside the PCRs.
	spec, _ := json.Marshal(map[string]any{"measurements": v["measurements"], "sevSnp": v["sevSnp"]})
	list := `{"apiVersion":"orrery.dev/v1alpha1","kind":"MeasurementSetList","items":[{"metadata":{"name":"` + s.Name + `"},"spec":` + string(spec) + `}]}`
	sets, err := ParseList([]byte(list))
	if err != nil || len(sets) != 1 || sets[0].SEVSNP == nil {
		t.Fatalf("ParseList: %v %+v", err, sets)
	}
	// Without its section the object holds the measurements of another set.
	list = `{"apiVersion":"orrery.dev/v1alpha1","kind":"MeasurementSetList","items":[{"metadata":{"name":"` + s.Name + `"},"spec":{"measurements":` + mustJSON(t, v["measurements"]) + `}}]}`
	if sets, err := ParseList([]byte(list)); err == nil || len(sets) != 0 {
		t.Fatal("a set stripped of its SEV-SNP section kept its name and was accepted")
	}
}

func mustJSON(t *testing.T, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
