package admitted

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/orrery-dev/orrery/internal/attestation"
)

func TestRoundTrip(t *testing.T) {
	r := Record{DiskUUID: "0B5C1F3E-8D2A-4C6B-9E7F-1A2B3C4D5E6F", Instance: attestation.Instance{Name: "worker-0", ID: "42"}, MeasurementSet: "image-0123456789abcdef"}
	obj, err := r.Object()
	if err != nil {
		t.Fatal(err)
	}
	if name := obj["metadata"].(map[string]any)["name"]; name != "disk-0b5c1f3e-8d2a-4c6b-9e7f-1a2b3c4d5e6f" {
		t.Fatalf("name %v", name)
	}
	raw, err := json.Marshal(obj)
	if err != nil {
		t.Fatal(err)
	}
	got, err := Parse(r.DiskUUID, raw)
	if err != nil || got.Instance != r.Instance || got.DiskUUID != strings.ToLower(r.DiskUUID) || got.MeasurementSet != r.MeasurementSet {
		t.Fatalf("Parse = %+v, %v", got, err)
	}
}

func TestRefusals(t *testing.T) {
	const disk = "0b5c1f3e-8d2a-4c6b-9e7f-1a2b3c4d5e6f"
	if _, err := Name("../../etc"); err == nil {
		t.Error("a malformed disk UUID got a record name")
	}
	if _, err := (Record{DiskUUID: disk}).Object(); err == nil {
		t.Error("a record without an instance was written")
	}
	for name, obj := range map[string]string{
		"another disk":  `{"kind":"AdmittedNode","spec":{"diskUUID":"11111111-1111-1111-1111-111111111111","instance":{"name":"w","id":"1"}}}`,
		"no instance":   `{"kind":"AdmittedNode","spec":{"diskUUID":"` + disk + `"}}`,
		"another kind":  `{"kind":"ConfigMap","spec":{"diskUUID":"` + disk + `","instance":{"name":"w","id":"1"}}}`,
		"not JSON":      `{"kind":`,
		"oversized":     `{"kind":"AdmittedNode","x":"` + strings.Repeat("a", maxObject) + `"}`,
		"wrong id type": `{"kind":"AdmittedNode","spec":{"diskUUID":"` + disk + `","instance":{"name":"w","id":1}}}`,
	} {
		if _, err := Parse(disk, []byte(obj)); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

func FuzzParse(f *testing.F) {
	f.Add([]byte(`{"kind":"AdmittedNode","spec":{"diskUUID":"0b5c1f3e-8d2a-4c6b-9e7f-1a2b3c4d5e6f","instance":{"name":"w","id":"1"}}}`))
	f.Fuzz(func(t *testing.T, obj []byte) {
		r, err := Parse("0b5c1f3e-8d2a-4c6b-9e7f-1a2b3c4d5e6f", obj)
		if err == nil && (r.Instance.Name == "" || r.Instance.ID == "" || !strings.EqualFold(r.DiskUUID, "0b5c1f3e-8d2a-4c6b-9e7f-1a2b3c4d5e6f")) {
			t.Fatalf("accepted an incomplete record %+v", r)
		}
	})
}
