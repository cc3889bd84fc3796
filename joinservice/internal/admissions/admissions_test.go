package admissions

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"

	"github.com/orrery-dev/orrery/internal/attestation"
	"github.com/orrery-dev/orrery/internal/owner/charts"
	"github.com/orrery-dev/orrery/internal/records/admitted"
	"github.com/orrery-dev/orrery/internal/records/orreryapi"
	"github.com/orrery-dev/orrery/internal/testkit/apiservertest"
	"github.com/orrery-dev/orrery/joinservice/internal/apiserver"
)

// newStore is a Store on a real API server with Orrery's CRDs installed
// (from the orrery-crds chart), as the join service has it.
func newStore(t *testing.T) (*Store, *apiservertest.Server) {
	t.Helper()
	srv := apiservertest.Start(t)
	manifest, err := charts.CRDManifest()
	if err != nil {
		t.Fatal(err)
	}
	srv.InstallCRDs(t, manifest)
	httpClient, err := rest.HTTPClientFor(srv.Config)
	if err != nil {
		t.Fatal(err)
	}
	s := &Store{Conn: &apiserver.Conn{Server: srv.Config.Host, HTTP: httpClient}}
	// A new CRD's lists answer 429 until the API server's cache of it
	// has started.
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		_, err := s.List(context.Background())
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the admitted nodes cannot be listed: %v", err)
		}
	}
	return s, srv
}

const disk = "0B5C1F3E-8D2A-4C6B-9E7F-1A2B3C4D5E6F"

var admittedNodes = schema.GroupVersionResource{Group: orreryapi.Group, Version: orreryapi.Version, Resource: orreryapi.AdmittedNodes}

func TestAdmitAndLookup(t *testing.T) {
	s, srv := newStore(t)
	ctx := context.Background()
	w0 := attestation.Instance{Name: "worker-0", ID: "1"}
	if _, found, err := s.Lookup(ctx, disk); found || err != nil {
		t.Fatalf("unknown disk: found %v, %v", found, err)
	}
	if err := s.Admit(ctx, admitted.Record{DiskUUID: disk, Instance: w0, MeasurementSet: "image-0000000000000001"}); err != nil {
		t.Fatal(err)
	}
	// A retried join of the same VM is fine, and records the set it
	// attested with this time.
	if err := s.Admit(ctx, admitted.Record{DiskUUID: strings.ToLower(disk), Instance: w0, MeasurementSet: "image-0000000000000002"}); err != nil {
		t.Fatalf("retried join of the same VM: %v", err)
	}
	if got, found, err := s.Lookup(ctx, strings.ToLower(disk)); !found || err != nil || got.Instance != w0 || got.Removed() {
		t.Fatalf("Lookup = %v, %v, %v", got, found, err)
	}
	obj, err := srv.Dynamic(t).Resource(admittedNodes).Get(ctx, "disk-"+strings.ToLower(disk), metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if set, _, _ := unstructured.NestedString(obj.Object, "spec", "measurementSet"); set != "image-0000000000000002" {
		t.Errorf("the record names set %q, want the last one", set)
	}
	// Another VM, even of the same name, cannot take the disk over.
	if err := s.Admit(ctx, admitted.Record{DiskUUID: disk, Instance: attestation.Instance{Name: "worker-0", ID: "2"}}); !errors.Is(err, ErrOtherInstance) {
		t.Fatalf("err = %v, want ErrOtherInstance", err)
	}
	if err := s.Admit(ctx, admitted.Record{DiskUUID: "../x", Instance: w0}); err == nil {
		t.Fatal("malformed disk UUID recorded")
	}
	if err := s.Attested(ctx, disk, "image-0000000000000003"); err != nil {
		t.Fatal(err)
	}
	// A record of a disk the owner deleted is gone for rejoins.
	if err := srv.Dynamic(t).Resource(admittedNodes).Delete(ctx, "disk-"+strings.ToLower(disk), metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, found, err := s.Lookup(ctx, disk); found || err != nil {
		t.Fatalf("a deleted record: found %v, %v", found, err)
	}
}

// A record the owner marked removed stays so: the join service sees it,
// refuses to admit the disk again, and nobody can take the mark back.
func TestRemovedRecord(t *testing.T) {
	s, srv := newStore(t)
	ctx := context.Background()
	w0 := attestation.Instance{Name: "worker-0", ID: "1"}
	if err := s.Admit(ctx, admitted.Record{DiskUUID: disk, Instance: w0, MeasurementSet: "image-0000000000000001"}); err != nil {
		t.Fatal(err)
	}
	records := srv.Dynamic(t).Resource(admittedNodes)
	name := "disk-" + strings.ToLower(disk)
	patch := func(p string) error {
		_, err := records.Patch(ctx, name, types.MergePatchType, []byte(p), metav1.PatchOptions{})
		return err
	}
	if err := patch(`{"spec":{"removedAt":"2026-11-27T12:00:00Z"}}`); err != nil {
		t.Fatalf("marking the record removed: %v", err)
	}
	rec, found, err := s.Lookup(ctx, disk)
	if err != nil || !found || !rec.Removed() || rec.Instance != w0 {
		t.Fatalf("Lookup = %+v, %v, %v; want the removed record", rec, found, err)
	}
	if err := s.Admit(ctx, admitted.Record{DiskUUID: disk, Instance: w0}); !errors.Is(err, ErrRemoved) {
		t.Fatalf("admitting the removed disk again: err = %v, want ErrRemoved", err)
	}
	for what, p := range map[string]string{
		"unmark":         `{"spec":{"removedAt":null}}`,
		"change":         `{"spec":{"removedAt":"2030-01-01T00:00:00Z"}}`,
		"not a time":     `{"spec":{"removedAt":"yesterday"}}`,
		"with a new set": `{"spec":{"removedAt":null,"measurementSet":"image-0000000000000002"}}`,
	} {
		if err := patch(p); err == nil {
			t.Errorf("%s the removal: allowed", what)
		}
	}
	// The join service's own update of the set leaves the mark.
	if err := s.Attested(ctx, disk, "image-0000000000000002"); err != nil {
		t.Fatal(err)
	}
	if rec, _, _ := s.Lookup(ctx, disk); !rec.Removed() {
		t.Fatal("recording the set unmarked the removal")
	}
}

// A node's addresses are recorded, and one address cannot be recorded
// for two live nodes; the API server itself refuses an address that is
// none.
func TestAdmitAddresses(t *testing.T) {
	s, srv := newStore(t)
	ctx := context.Background()
	w0 := admitted.Record{DiskUUID: disk, Instance: attestation.Instance{Name: "worker-0", ID: "1"}, Addresses: []netip.Addr{netip.MustParseAddr("10.42.1.0")}}
	if err := s.Admit(ctx, w0); err != nil {
		t.Fatal(err)
	}
	// Its retried join states another address: the record follows.
	w0.Addresses = []netip.Addr{netip.MustParseAddr("10.42.1.7")}
	if err := s.Admit(ctx, w0); err != nil {
		t.Fatal(err)
	}
	recs, err := s.List(ctx)
	if err != nil || len(recs) != 1 || len(recs[0].Addresses) != 1 || recs[0].Addresses[0] != w0.Addresses[0] {
		t.Fatalf("List = %+v, %v; want worker-0 at 10.42.1.7", recs, err)
	}
	w1 := admitted.Record{DiskUUID: "11111111-1111-1111-1111-111111111111", Instance: attestation.Instance{Name: "worker-1", ID: "2"}, Addresses: w0.Addresses}
	if err := s.Admit(ctx, w1); !errors.Is(err, ErrAddressTaken) || !strings.Contains(err.Error(), "worker-0") {
		t.Fatalf("worker-1 with worker-0's address: %v, want ErrAddressTaken", err)
	}
	if _, found, _ := s.Lookup(ctx, w1.DiskUUID); found {
		t.Fatal("the refused disk was recorded")
	}
	// A second VM under worker-0's certified name, with an address of its
	// own, is refused while worker-0 is in the cluster.
	twin := admitted.Record{DiskUUID: "22222222-2222-2222-2222-222222222222", Instance: attestation.Instance{Name: "worker-0", ID: "3"}, Addresses: []netip.Addr{netip.MustParseAddr("10.42.1.9")}}
	if err := s.Admit(ctx, twin); !errors.Is(err, ErrNameTaken) || !strings.Contains(err.Error(), "worker-0 (instance ID 1)") {
		t.Fatalf("a second VM named worker-0: %v, want ErrNameTaken naming worker-0", err)
	}
	if _, found, _ := s.Lookup(ctx, twin.DiskUUID); found {
		t.Fatal("the second VM under worker-0's name was recorded")
	}
	bad := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": orreryapi.APIVersion, "kind": orreryapi.AdmittedNodeKind,
		"metadata": map[string]any{"name": "disk-" + w1.DiskUUID},
		"spec":     map[string]any{"diskUUID": w1.DiskUUID, "instance": map[string]any{"name": "w", "id": "2"}, "addresses": []any{"127.0.0.1"}},
	}}
	if _, err := srv.Dynamic(t).Resource(admittedNodes).Create(ctx, bad, metav1.CreateOptions{}); err == nil || !strings.Contains(err.Error(), "unicast") {
		t.Fatalf("a record with a loopback address: %v, want the CRD's refusal", err)
	}
}

// List reads every page of the records.
func TestListPages(t *testing.T) {
	s, _ := newStore(t)
	ctx := context.Background()
	defer func(n int) { listPage = n }(listPage)
	listPage = 1
	for i, name := range []string{"worker-0", "worker-1", "worker-2"} {
		rec := admitted.Record{DiskUUID: "0b5c1f3e-8d2a-4c6b-9e7f-1a2b3c4d5e6" + string(rune('0'+i)), Instance: attestation.Instance{Name: name, ID: name}}
		if err := s.Admit(ctx, rec); err != nil {
			t.Fatal(err)
		}
	}
	recs, err := s.List(ctx)
	if err != nil || len(recs) != 3 {
		t.Fatalf("List = %d records, %v; want 3", len(recs), err)
	}
}

// A record changed by someone into another disk's is not believed.
func TestLookupChecksTheRecord(t *testing.T) {
	s, srv := newStore(t)
	ctx := context.Background()
	other := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": orreryapi.APIVersion, "kind": orreryapi.AdmittedNodeKind,
		"metadata": map[string]any{"name": "disk-11111111-1111-1111-1111-111111111111"},
		"spec":     map[string]any{"diskUUID": "11111111-1111-1111-1111-111111111111", "instance": map[string]any{"name": "w", "id": "1"}},
	}}
	if _, err := srv.Dynamic(t).Resource(admittedNodes).Create(ctx, other, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, found, err := s.Lookup(ctx, "11111111-1111-1111-1111-111111111111"); !found || err != nil {
		t.Fatalf("a good record: %v %v", found, err)
	}
}

func TestAPIServerRefusal(t *testing.T) {
	s, srv := newStore(t)
	// The cluster's CA, but no client certificate and a token the API
	// server does not know.
	anon, err := rest.HTTPClientFor(rest.AnonymousClientConfig(srv.Config))
	if err != nil {
		t.Fatal(err)
	}
	s.Conn.HTTP, s.Conn.Token = anon, "wrong"
	if err := s.Admit(context.Background(), admitted.Record{DiskUUID: disk, Instance: attestation.Instance{Name: "w", ID: "1"}}); err == nil || !strings.Contains(err.Error(), "401") {
		t.Fatalf("err = %v, want the API server's refusal", err)
	}
	if _, _, err := s.Lookup(context.Background(), disk); err == nil || !strings.Contains(err.Error(), "401") {
		t.Fatalf("err = %v, want the API server's refusal", err)
	}
}

// Root on two VMs joins both at once with one address, hoping both
// pass the check before either is recorded: of eight racing joins, one
// is admitted, the others refused, and the one record holds it.
func TestAdmitRacingForOneAddress(t *testing.T) {
	s, _ := newStore(t)
	ctx := context.Background()
	const racers = 8
	errs := make([]error, racers)
	var wg sync.WaitGroup
	for i := range racers {
		wg.Go(func() {
			errs[i] = s.Admit(ctx, admitted.Record{DiskUUID: fmt.Sprintf("33333333-3333-3333-3333-33333333333%d", i),
				Instance: attestation.Instance{Name: fmt.Sprintf("racer-%d", i), ID: strconv.Itoa(100 + i)}, Addresses: []netip.Addr{netip.MustParseAddr("10.42.1.50")}})
		})
	}
	wg.Wait()
	admittedOnes := 0
	for i, err := range errs {
		switch {
		case err == nil:
			admittedOnes++
		case errors.Is(err, ErrAddressTaken) || errors.Is(err, ErrClaimPending):
		default:
			t.Errorf("racer %d: %v, want the address refused", i, err)
		}
	}
	recs, err := s.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if admittedOnes != 1 || len(recs) != 1 {
		t.Fatalf("%d racers admitted, %d records (%+v); want one of each", admittedOnes, len(recs), recs)
	}
}

// A claim left by a join that never recorded its node stands for
// claimGrace (its join may be recording now), then lapses; one whose
// holder's record moved to other addresses lapses at once.
func TestClaimsLapse(t *testing.T) {
	s, _ := newStore(t)
	ctx := context.Background()
	now := time.Now()
	s.Now = func() time.Time { return now }
	addr := []netip.Addr{netip.MustParseAddr("10.42.1.60")}
	ghost := admitted.Record{DiskUUID: "44444444-4444-4444-4444-444444444444", Instance: attestation.Instance{Name: "ghost", ID: "44"}, Addresses: addr}
	if err := s.claim(ctx, ghost); err != nil {
		t.Fatal(err)
	}
	late := admitted.Record{DiskUUID: "55555555-5555-5555-5555-555555555555", Instance: attestation.Instance{Name: "late", ID: "55"}, Addresses: addr}
	if err := s.Admit(ctx, late); !errors.Is(err, ErrClaimPending) || !strings.Contains(err.Error(), ghost.DiskUUID) {
		t.Fatalf("an address claimed a moment ago by a join not yet recorded: %v, want ErrClaimPending naming its disk", err)
	}
	now = now.Add(claimGrace)
	if err := s.Admit(ctx, late); err != nil {
		t.Fatalf("an address whose claim lapsed: %v", err)
	}
	// late's retried join states another address: its old one is free.
	late.Addresses = []netip.Addr{netip.MustParseAddr("10.42.1.61")}
	if err := s.Admit(ctx, late); err != nil {
		t.Fatal(err)
	}
	next := admitted.Record{DiskUUID: "66666666-6666-6666-6666-666666666666", Instance: attestation.Instance{Name: "next", ID: "66"}, Addresses: addr}
	if err := s.Admit(ctx, next); err != nil {
		t.Fatalf("the address late no longer states: %v", err)
	}
}

// A removed node's name is not handed to another VM while the removed
// node's certificates may be valid: 'orrery node remove' marks the records
// first and lists the name only after the drain, and in between a VM
// admitted under the name would have the removed kubelet's serving
// requests approved for its addresses.
func TestARemovedNodesNameIsHeld(t *testing.T) {
	s, srv := newStore(t)
	ctx := context.Background()
	removedAt := time.Date(2026, 11, 27, 12, 0, 0, 0, time.UTC)
	now := removedAt.Add(time.Minute)
	s.Now = func() time.Time { return now }
	w0 := attestation.Instance{Name: "worker-0", ID: "1"}
	if err := s.Admit(ctx, admitted.Record{DiskUUID: disk, Instance: w0, Addresses: []netip.Addr{netip.MustParseAddr("10.42.1.70")}}); err != nil {
		t.Fatal(err)
	}
	_, err := srv.Dynamic(t).Resource(admittedNodes).Patch(ctx, "disk-"+strings.ToLower(disk), types.MergePatchType,
		[]byte(`{"spec":{"removedAt":"`+removedAt.Format(time.RFC3339)+`"}}`), metav1.PatchOptions{})
	if err != nil {
		t.Fatal(err)
	}
	again := admitted.Record{DiskUUID: "77777777-7777-7777-7777-777777777777", Instance: attestation.Instance{Name: "worker-0", ID: "2"},
		Addresses: []netip.Addr{netip.MustParseAddr("10.42.1.71")}}
	err = s.Admit(ctx, again)
	if !errors.Is(err, ErrNameTaken) || !strings.Contains(err.Error(), "removed at "+removedAt.Format(time.RFC3339)) {
		t.Fatalf("another VM under a name removed a minute ago: %v, want ErrNameTaken saying when it was removed", err)
	}
	now = removedAt.Add(admitted.KubeletCertLifetime + time.Minute)
	if err := s.Admit(ctx, again); err != nil {
		t.Fatalf("the name once every certificate of the removed node expired: %v", err)
	}
}
