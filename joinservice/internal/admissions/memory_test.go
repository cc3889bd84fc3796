package admissions

import (
	"context"
	"errors"
	"testing"

	"github.com/orrery-dev/orrery/internal/attestation"
	"github.com/orrery-dev/orrery/internal/records/admitted"
)

func TestMemoryHasStoreSemantics(t *testing.T) {
	ctx := context.Background()
	var m Memory
	a := attestation.Instance{Name: "worker-0", ID: "1"}
	const disk = "0B5C1F3E-8D2A-4C6B-9E7F-1A2B3C4D5E6F"
	if _, found, _ := m.Lookup(ctx, disk); found {
		t.Fatal("an empty record knows a disk")
	}
	if err := m.Admit(ctx, admitted.Record{DiskUUID: disk, Instance: a}); err != nil {
		t.Fatal(err)
	}
	if err := m.Admit(ctx, admitted.Record{DiskUUID: disk, Instance: a}); err != nil {
		t.Fatalf("a retried admission of the same VM: %v", err)
	}
	if err := m.Admit(ctx, admitted.Record{DiskUUID: disk, Instance: attestation.Instance{Name: "worker-0", ID: "2"}}); !errors.Is(err, ErrOtherInstance) {
		t.Fatalf("the disk admitted for another VM: %v, want ErrOtherInstance", err)
	}
	if got, found, _ := m.Lookup(ctx, "0b5c1f3e-8d2a-4c6b-9e7f-1a2b3c4d5e6f"); !found || got.Instance != a {
		t.Fatalf("lookup in lower case = %v %v, want %v", got, found, a)
	}
}
