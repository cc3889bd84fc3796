package admitted

import (
	"encoding/json"
	"errors"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/orrery-dev/orrery/internal/attestation"
)

func TestRoundTrip(t *testing.T) {
	r := Record{DiskUUID: "0B5C1F3E-8D2A-4C6B-9E7F-1A2B3C4D5E6F", Instance: attestation.Instance{Name: "worker-0", ID: "42"}, MeasurementSet: "image-0123456789abcdef",
		Generation: MaxGeneration - 1, NextGeneration: MaxGeneration, Addresses: []netip.Addr{netip.MustParseAddr("10.42.1.0"), netip.MustParseAddr("fd00::1")}}
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
	if err != nil || got.Instance != r.Instance || got.DiskUUID != strings.ToLower(r.DiskUUID) || got.MeasurementSet != r.MeasurementSet ||
		got.Generation != r.Generation || got.NextGeneration != r.NextGeneration || !slices.Equal(got.Addresses, r.Addresses) {
		t.Fatalf("Parse = %+v, %v", got, err)
	}
	// A record written before generations holds none: generation 0.
	got, err = Parse(r.DiskUUID, []byte(`{"kind":"AdmittedNode","spec":{"diskUUID":"0b5c1f3e-8d2a-4c6b-9e7f-1a2b3c4d5e6f","instance":{"name":"w","id":"1"}}}`))
	if err != nil || got.Generation != 0 || got.NextGeneration != 0 {
		t.Fatalf("a record without generations: %+v, %v", got, err)
	}
	if _, err := (Record{DiskUUID: r.DiskUUID, Instance: r.Instance, Generation: MaxGeneration + 1}).Object(); err == nil {
		t.Error("a record with a generation above MaxGeneration was written")
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
		"another disk":             `{"kind":"AdmittedNode","spec":{"diskUUID":"11111111-1111-1111-1111-111111111111","instance":{"name":"w","id":"1"}}}`,
		"no instance":              `{"kind":"AdmittedNode","spec":{"diskUUID":"` + disk + `"}}`,
		"another kind":             `{"kind":"ConfigMap","spec":{"diskUUID":"` + disk + `","instance":{"name":"w","id":"1"}}}`,
		"not JSON":                 `{"kind":`,
		"oversized":                `{"kind":"AdmittedNode","x":"` + strings.Repeat("a", maxObject) + `"}`,
		"wrong id type":            `{"kind":"AdmittedNode","spec":{"diskUUID":"` + disk + `","instance":{"name":"w","id":1}}}`,
		"negative generation":      `{"kind":"AdmittedNode","spec":{"diskUUID":"` + disk + `","instance":{"name":"w","id":"1"},"generation":-1}}`,
		"huge generation":          `{"kind":"AdmittedNode","spec":{"diskUUID":"` + disk + `","instance":{"name":"w","id":"1"},"generation":9007199254740992}}`,
		"generation past int64":    `{"kind":"AdmittedNode","spec":{"diskUUID":"` + disk + `","instance":{"name":"w","id":"1"},"generation":18446744073709551615}}`,
		"fractional generation":    `{"kind":"AdmittedNode","spec":{"diskUUID":"` + disk + `","instance":{"name":"w","id":"1"},"generation":1.5}}`,
		"generation as a string":   `{"kind":"AdmittedNode","spec":{"diskUUID":"` + disk + `","instance":{"name":"w","id":"1"},"generation":"7"}}`,
		"negative next generation": `{"kind":"AdmittedNode","spec":{"diskUUID":"` + disk + `","instance":{"name":"w","id":"1"},"nextGeneration":-5}}`,
		"address not an address":   `{"kind":"AdmittedNode","spec":{"diskUUID":"` + disk + `","instance":{"name":"w","id":"1"},"addresses":["worker-1"]}}`,
		"loopback address":         `{"kind":"AdmittedNode","spec":{"diskUUID":"` + disk + `","instance":{"name":"w","id":"1"},"addresses":["127.0.0.1"]}}`,
		"address twice":            `{"kind":"AdmittedNode","spec":{"diskUUID":"` + disk + `","instance":{"name":"w","id":"1"},"addresses":["10.0.0.1","10.0.0.1"]}}`,
		"too many addresses":       `{"kind":"AdmittedNode","spec":{"diskUUID":"` + disk + `","instance":{"name":"w","id":"1"},"addresses":["10.0.0.1","10.0.0.2","10.0.0.3","10.0.0.4","10.0.0.5"]}}`,
		"mapped address":           `{"kind":"AdmittedNode","spec":{"diskUUID":"` + disk + `","instance":{"name":"w","id":"1"},"addresses":["::ffff:10.0.0.1"]}}`,
	} {
		if _, err := Parse(disk, []byte(obj)); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

func TestCheckAddresses(t *testing.T) {
	good := []string{"10.42.1.0", "192.168.7.3", "fd00::1", "2001:db8::5"}
	if _, err := ParseAddresses(good); err != nil {
		t.Errorf("%v: %v", good, err)
	}
	for _, bad := range []string{"0.0.0.0", "::", "127.0.0.1", "::1", "169.254.1.1", "fe80::1", "fe80::1%eth0", "224.0.0.1", "ff02::1", "::ffff:10.0.0.1", "10.0.0.1/24", ""} {
		if _, err := ParseAddresses([]string{bad}); err == nil {
			t.Errorf("%q accepted as a node's address", bad)
		}
	}
	if _, err := (Record{DiskUUID: "0b5c1f3e-8d2a-4c6b-9e7f-1a2b3c4d5e6f", Instance: attestation.Instance{Name: "w", ID: "1"}, Addresses: []netip.Addr{netip.MustParseAddr("::1")}}).Object(); err == nil {
		t.Error("a record with a loopback address was written")
	}
}

func TestParseList(t *testing.T) {
	list := `{"items":[
		{"kind":"AdmittedNode","metadata":{"name":"disk-0b5c1f3e-8d2a-4c6b-9e7f-1a2b3c4d5e6f"},"spec":{"diskUUID":"0b5c1f3e-8d2a-4c6b-9e7f-1a2b3c4d5e6f","instance":{"name":"w0","id":"1"},"addresses":["10.42.1.0"]}},
		{"kind":"AdmittedNode","metadata":{"name":"disk-11111111-1111-1111-1111-111111111111"},"spec":{"diskUUID":"0b5c1f3e-8d2a-4c6b-9e7f-1a2b3c4d5e6f","instance":{"name":"w1","id":"2"}}},
		{"kind":"AdmittedNode","metadata":{"name":"x"},"spec":{}},
		{"kind":"AdmittedNode","metadata":{"name":"disk-22222222-2222-2222-2222-222222222222"},"spec":{"diskUUID":"22222222-2222-2222-2222-222222222222","instance":{"name":"w2","id":"3"}}}]}`
	recs, err := ParseList([]byte(list))
	if len(recs) != 2 || recs[0].Instance.Name != "w0" || recs[1].Instance.Name != "w2" || len(recs[0].Addresses) != 1 {
		t.Fatalf("ParseList kept %+v", recs)
	}
	// The record stored under another disk's name, and the badly named
	// one, are named in the error.
	var bad *BadItemsError
	if !errors.As(err, &bad) || len(bad.Errs) != 2 || !strings.Contains(err.Error(), "holds disk") || !strings.Contains(err.Error(), `"x"`) {
		t.Errorf("ParseList's error: %v", err)
	}
	if _, err := ParseList([]byte(`{"items":`)); err == nil || errors.As(err, &bad) {
		t.Errorf("a truncated list: %v, want an error that is not about items", err)
	}
}

func FuzzParse(f *testing.F) {
	f.Add([]byte(`{"kind":"AdmittedNode","spec":{"diskUUID":"0b5c1f3e-8d2a-4c6b-9e7f-1a2b3c4d5e6f","instance":{"name":"w","id":"1"}}}`))
	f.Add([]byte(`{"kind":"AdmittedNode","spec":{"diskUUID":"0b5c1f3e-8d2a-4c6b-9e7f-1a2b3c4d5e6f","instance":{"name":"w","id":"1"},"generation":3,"nextGeneration":4}}`))
	f.Fuzz(func(t *testing.T, obj []byte) {
		r, err := Parse("0b5c1f3e-8d2a-4c6b-9e7f-1a2b3c4d5e6f", obj)
		if err == nil && (r.Instance.Name == "" || r.Instance.ID == "" || !strings.EqualFold(r.DiskUUID, "0b5c1f3e-8d2a-4c6b-9e7f-1a2b3c4d5e6f") ||
			r.Generation > MaxGeneration || r.NextGeneration > MaxGeneration || CheckAddresses(r.Addresses) != nil) {
			t.Fatalf("accepted an incomplete record %+v", r)
		}
	})
}
