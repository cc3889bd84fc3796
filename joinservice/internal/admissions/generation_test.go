package admissions

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"

	"github.com/orrery-dev/orrery/internal/attestation"
	"github.com/orrery-dev/orrery/internal/records/admitted"
	"github.com/orrery-dev/orrery/joinservice/internal/apiserver"
)

// The disk's generation on a real API server: rejoins advance it, an
// older copy is refused, a crash between the steps locks nothing out,
// and the CRD keeps out what is not a generation.
func TestGenerationOnTheAPIServer(t *testing.T) {
	s, srv := newStore(t)
	ctx := context.Background()
	checkRejoinsAdvanceTheGeneration(t, ctx, s)
	checkConcurrentChecksNeverShareAGeneration(t, ctx, s)

	records := srv.Dynamic(t).Resource(admittedNodes)
	name := "disk-" + strings.ToLower(disk)
	for what, p := range map[string]string{
		"negative":   `{"spec":{"generation":-1}}`,
		"too large":  `{"spec":{"generation":9007199254740992}}`,
		"a string":   `{"spec":{"generation":"5"}}`,
		"fractional": `{"spec":{"nextGeneration":1.5}}`,
	} {
		if _, err := records.Patch(ctx, name, types.MergePatchType, []byte(p), metav1.PatchOptions{}); err == nil {
			t.Errorf("a %s generation was stored", what)
		}
	}
	// The owner restores a copy on purpose, as the refusal says.
	if _, err := records.Patch(ctx, name, types.MergePatchType, []byte(`{"spec":{"generation":2,"nextGeneration":null}}`), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.CheckGeneration(ctx, disk, 2); err != nil {
		t.Fatalf("the copy the owner accepted: %v", err)
	}
	obj, err := records.Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if set, _, _ := unstructured.NestedString(obj.Object, "spec", "measurementSet"); set != "image-0000000000000001" {
		t.Errorf("recording generations changed the measurement set to %q", set)
	}

	// A removed node's disk has no generation to advance.
	if _, err := records.Patch(ctx, name, types.MergePatchType, []byte(`{"spec":{"removedAt":"2026-11-27T12:00:00Z"}}`), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.CheckGeneration(ctx, disk, 2); !errors.Is(err, ErrRemoved) {
		t.Fatalf("removed: err = %v, want ErrRemoved", err)
	}
}

// checkRejoinsAdvanceTheGeneration admits disk and takes it through
// rejoins, a crash between the steps and an older copy, leaving its
// record at generation 4.
func checkRejoinsAdvanceTheGeneration(t *testing.T, ctx context.Context, s *Store) {
	t.Helper()
	if _, err := s.CheckGeneration(ctx, disk, 0); !errors.Is(err, ErrNotFound) {
		t.Fatalf("a disk never admitted: err = %v, want ErrNotFound", err)
	}
	if err := s.Admit(ctx, admitted.Record{DiskUUID: disk, Instance: attestation.Instance{Name: "worker-0", ID: "1"}, MeasurementSet: "image-0000000000000001"}); err != nil {
		t.Fatal(err)
	}
	// Admitted without a generation, as before this check existed: the
	// disk holds none, and its first rejoin starts the count.
	var onDisk uint64
	for want := uint64(1); want <= 2; want++ {
		next, err := s.CheckGeneration(ctx, disk, onDisk)
		if err != nil || next != want {
			t.Fatalf("CheckGeneration(%d) = %d, %v; want %d", onDisk, next, err, want)
		}
		onDisk = next
		if err := s.RecordGeneration(ctx, disk, onDisk); err != nil {
			t.Fatal(err)
		}
	}
	// A crash after the write: the next boot presents what it wrote.
	next, err := s.CheckGeneration(ctx, disk, onDisk)
	if err != nil {
		t.Fatal(err)
	}
	if next, err = s.CheckGeneration(ctx, disk, next); err != nil || next != 4 {
		t.Fatalf("after a crash before the record: %d, %v; want 4", next, err)
	}
	if err := s.RecordGeneration(ctx, disk, next); err != nil {
		t.Fatal(err)
	}
	rec, _, err := s.Lookup(ctx, disk)
	if err != nil || rec.Generation != 4 || rec.NextGeneration != 0 {
		t.Fatalf("record: %+v, %v; want generation 4, nothing pending", rec, err)
	}
	var older *admitted.GenerationError
	if _, err := s.CheckGeneration(ctx, disk, 2); !errors.As(err, &older) || older.Recorded != 4 {
		t.Fatalf("older copy: err = %v, want a GenerationError against 4", err)
	}
	if err := s.RecordGeneration(ctx, disk, 17); !errors.Is(err, admitted.ErrNotIssued) {
		t.Fatalf("recording a generation never issued: err = %v", err)
	}
}

// checkConcurrentChecksNeverShareAGeneration checks disk, recorded at
// generation 4, from four copies at once.
func checkConcurrentChecksNeverShareAGeneration(t *testing.T, ctx context.Context, s *Store) {
	t.Helper()
	// Two checks at once (two copies booted together) are never both
	// given the same generation: the second write to the record sees
	// the first's.
	var wg sync.WaitGroup
	got := make([]uint64, 4)
	errs := make([]error, 4)
	for i := range got {
		wg.Go(func() { got[i], errs[i] = s.CheckGeneration(ctx, disk, 4) })
	}
	wg.Wait()
	seen := map[uint64]bool{}
	for i, g := range got {
		if errs[i] != nil {
			continue // a later check superseded its read: refused, fine
		}
		if seen[g] {
			t.Fatalf("generation %d issued twice: %v %v", g, got, errs)
		}
		seen[g] = true
	}
}

// fakeRecord is an API server that holds one AdmittedNode, at a
// resourceVersion, and refuses a write whose version is stale, as the
// real one does; conflicts more makes that many writes conflict first
// (another writer came in between).
type fakeRecord struct {
	mu        sync.Mutex
	version   int
	spec      map[string]any
	conflicts int
	patches   []string
	// oldCRD answers as an API server whose CRD has no generations: it
	// drops them.
	oldCRD bool
}

func (f *fakeRecord) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	defer f.mu.Unlock()
	switch r.Method {
	case http.MethodGet:
		json.NewEncoder(w).Encode(map[string]any{
			"kind": "AdmittedNode", "metadata": map[string]any{"resourceVersion": fmt.Sprint(f.version)}, "spec": f.spec,
		})
	case http.MethodPatch:
		body, _ := io.ReadAll(r.Body)
		f.patches = append(f.patches, string(body))
		var p struct {
			Metadata struct {
				ResourceVersion string `json:"resourceVersion"`
			} `json:"metadata"`
			Spec map[string]any `json:"spec"`
		}
		json.Unmarshal(body, &p)
		if f.conflicts > 0 || p.Metadata.ResourceVersion != fmt.Sprint(f.version) {
			if f.conflicts > 0 {
				f.conflicts--
				f.version++ // the other writer's
			}
			http.Error(w, `{"kind":"Status","reason":"Conflict"}`, http.StatusConflict)
			return
		}
		for k, v := range p.Spec {
			if v == nil {
				delete(f.spec, k)
			} else {
				f.spec[k] = v
			}
		}
		f.version++
		spec := maps.Clone(f.spec)
		if f.oldCRD {
			delete(spec, "generation")
			delete(spec, "nextGeneration")
		}
		json.NewEncoder(w).Encode(map[string]any{"kind": "AdmittedNode", "spec": spec})
	default:
		http.Error(w, "no", http.StatusMethodNotAllowed)
	}
}

// Every write of a generation is conditional on the version it read, and
// a conflict makes it read again; a record that keeps changing gives up
// with an error, never a blind write.
func TestGenerationWriteIsConditional(t *testing.T) {
	f := &fakeRecord{version: 7, conflicts: 2, spec: map[string]any{
		"diskUUID": strings.ToLower(disk), "instance": map[string]any{"name": "w", "id": "1"}, "generation": 3,
	}}
	ts := httptest.NewServer(f)
	defer ts.Close()
	s := &Store{Conn: &apiserver.Conn{Server: ts.URL, HTTP: ts.Client()}}
	next, err := s.CheckGeneration(context.Background(), disk, 3)
	if err != nil || next != 4 {
		t.Fatalf("CheckGeneration = %d, %v; want 4", next, err)
	}
	if len(f.patches) != 3 {
		t.Fatalf("%d writes, want 3 (two conflicts): %q", len(f.patches), f.patches)
	}
	for i, p := range f.patches {
		if want := fmt.Sprintf(`"resourceVersion":"%d"`, 7+i); !strings.Contains(p, want) {
			t.Errorf("write %d: %s\ndoes not hold %s", i, p, want)
		}
	}
	if got := f.patches[2]; !strings.Contains(got, `"generation":3`) || !strings.Contains(got, `"nextGeneration":4`) {
		t.Errorf("last write %s", got)
	}
	// Recording clears the pending generation.
	if err := s.RecordGeneration(context.Background(), disk, 4); err != nil {
		t.Fatal(err)
	}
	if _, pending := f.spec["nextGeneration"]; pending || fmt.Sprint(f.spec["generation"]) != "4" {
		t.Errorf("after the record: %v", f.spec)
	}

	f.conflicts = updateAttempts
	if _, err := s.CheckGeneration(context.Background(), disk, 4); err == nil || !strings.Contains(err.Error(), "ask again") {
		t.Fatalf("a record that changes under every attempt: err = %v", err)
	}

	// A CRD from before generations would drop them without a word: the
	// join service says so rather than believe the write.
	f.oldCRD = true
	if _, err := s.CheckGeneration(context.Background(), disk, 4); err == nil || !strings.Contains(err.Error(), "upgrade the orrery-crds chart") {
		t.Fatalf("an API server that drops the generation: err = %v", err)
	}
}
