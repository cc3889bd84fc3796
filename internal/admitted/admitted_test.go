package admitted

import (
	"strings"
	"testing"

	"github.com/orrery-dev/orrery/internal/attestation"
)

func TestRoundTrip(t *testing.T) {
	r := Record{DiskUUID: "0B5C1F3E-8D2A-4C6B-9E7F-1A2B3C4D5E6F", Instance: attestation.Instance{Name: "worker-0", ID: "42"}}
	cm, err := r.ConfigMap()
	if err != nil {
		t.Fatal(err)
	}
	if name := cm["metadata"].(map[string]any)["name"]; name != "orrery-admitted-disk-0b5c1f3e-8d2a-4c6b-9e7f-1a2b3c4d5e6f" {
		t.Fatalf("name %v", name)
	}
	got, err := Parse(r.DiskUUID, cm["data"].(map[string]string))
	if err != nil || got.Instance != r.Instance || got.DiskUUID != strings.ToLower(r.DiskUUID) {
		t.Fatalf("Parse = %v, %v", got, err)
	}
}

func TestRefusals(t *testing.T) {
	if _, err := Name("../../etc"); err == nil {
		t.Error("a malformed disk UUID got a record name")
	}
	if _, err := (Record{DiskUUID: "0b5c1f3e-8d2a-4c6b-9e7f-1a2b3c4d5e6f"}).ConfigMap(); err == nil {
		t.Error("a record without an instance was written")
	}
	other := map[string]string{DiskUUIDKey: "11111111-1111-1111-1111-111111111111", InstanceNameKey: "w", InstanceIDKey: "1"}
	if _, err := Parse("0b5c1f3e-8d2a-4c6b-9e7f-1a2b3c4d5e6f", other); err == nil {
		t.Error("a record of another disk was accepted")
	}
	if _, err := Parse("0b5c1f3e-8d2a-4c6b-9e7f-1a2b3c4d5e6f", map[string]string{DiskUUIDKey: "0b5c1f3e-8d2a-4c6b-9e7f-1a2b3c4d5e6f"}); err == nil {
		t.Error("a record without an instance was accepted")
	}
}
