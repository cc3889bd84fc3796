package admitted

import (
	"errors"
	"reflect"
	"strings"
	"testing"

	"github.com/orrery-dev/orrery/internal/attestation"
)

func newRecord() Record {
	return Record{DiskUUID: "0b5c1f3e-8d2a-4c6b-9e7f-1a2b3c4d5e6f", Instance: attestation.Instance{Name: "worker-0", ID: "42"}}
}

// boot runs a genuine rejoin's generation check on a disk holding disk:
// it returns what the disk and the record hold afterwards.
func boot(t *testing.T, r Record, disk uint64) (Record, uint64) {
	t.Helper()
	r, err := r.CheckGeneration(disk)
	if err != nil {
		t.Fatalf("a disk holding generation %d was refused: %v", disk, err)
	}
	disk = r.NextGeneration
	if r, err = r.RecordGeneration(disk); err != nil {
		t.Fatal(err)
	}
	return r, disk
}

func TestGenerationOfRejoins(t *testing.T) {
	r, live := newRecord(), uint64(0)
	// A disk admitted before generations (or a new one) holds none,
	// nor does its record: its first rejoin starts the count.
	r, live = boot(t, r, live)
	if r.Generation != 1 || live != 1 || r.NextGeneration != 0 {
		t.Fatalf("after the first rejoin: record %d (next %d), disk %d; want 1, 1", r.Generation, r.NextGeneration, live)
	}
	copyAt1 := live
	r, live = boot(t, r, live)
	// The host swaps in the copy taken before the last boot: refused,
	// and saying so.
	_, err := r.CheckGeneration(copyAt1)
	var gerr *GenerationError
	if !errors.As(err, &gerr) || gerr.Presented != 1 || gerr.Recorded != 2 || gerr.Superseded {
		t.Fatalf("an older copy: err = %v, want a GenerationError presenting 1 against 2", err)
	}
	if want := "presents generation 1 but the cluster recorded 2: it is an older copy of the disk"; !strings.Contains(err.Error(), want) {
		t.Errorf("%v\ndoes not say %q", err, want)
	}
	// A disk without the file, once the record holds a generation: the
	// oldest copy of all.
	if _, err := r.CheckGeneration(0); !errors.As(err, &gerr) {
		t.Errorf("a copy from before the first rejoin: err = %v, want a GenerationError", err)
	}
	// The live disk goes on.
	if _, live2 := boot(t, r, live); live2 <= live {
		t.Errorf("the generation went from %d to %d", live, live2)
	}
}

// A crash or a lost answer at any step leaves a disk that the next boot
// accepts: the node is never locked out of its own disk.
func TestGenerationSurvivesCrashes(t *testing.T) {
	r, live := boot(t, newRecord(), 0)
	// Crash after the check, before the write: the disk holds the
	// record's generation, and a later check issued another.
	checked, err := r.CheckGeneration(live)
	if err != nil {
		t.Fatal(err)
	}
	r = checked
	r, live = boot(t, r, live)
	// Crash after the write, before the record: the disk holds the
	// generation issued last.
	if r, err = r.CheckGeneration(live); err != nil {
		t.Fatal(err)
	}
	live = r.NextGeneration
	r, live = boot(t, r, live)
	// The record's answer was lost: the node records again, or checks
	// again; both work.
	if r, err = r.CheckGeneration(live); err != nil {
		t.Fatal(err)
	}
	live = r.NextGeneration
	if r, err = r.RecordGeneration(live); err != nil {
		t.Fatal(err)
	}
	if again, err := r.RecordGeneration(live); err != nil || !reflect.DeepEqual(again, r) {
		t.Fatalf("recording the same generation again: %+v, %v", again, err)
	}
	boot(t, r, live)
}

// A host that boots an older copy again and again gets it refused every
// time, and it never catches up: the node writes nothing to a disk the
// check refused. Had the node written its disk's generation plus one
// before asking, each refused boot would have advanced the copy, and the
// copy would pass once it reached the record.
func TestOlderCopyNeverCatchesUp(t *testing.T) {
	r, live := boot(t, newRecord(), 0)
	old := live
	for range 3 {
		r, live = boot(t, r, live)
	}
	for range 10 {
		if _, err := r.CheckGeneration(old); err == nil {
			t.Fatalf("copy holding %d accepted against record %d", old, r.Generation)
		}
	}
	// Nor can the host stop the live disk's boots after their write to
	// make the live disk's generation run ahead, keep it, run the node on
	// a copy, and swap the live disk back in: every generation is issued
	// once.
	cp := live // a copy taken before the boot below
	r, err := r.CheckGeneration(live)
	if err != nil {
		t.Fatal(err)
	}
	ahead := r.NextGeneration // written to the live disk, never recorded
	r, cp = boot(t, r, cp)
	if cp <= ahead {
		t.Fatalf("the copy was given %d, not more than %d issued before it", cp, ahead)
	}
	if _, err := r.CheckGeneration(ahead); err == nil {
		t.Fatalf("the disk that ran ahead (%d) was accepted after the copy ran on %d", ahead, cp)
	}
}

func TestGenerationSuperseded(t *testing.T) {
	r, live := boot(t, newRecord(), 0)
	cp := live
	// The live disk is checked and written, and its boot stops before
	// the record; then the host boots the copy, which is checked too.
	r, _ = r.CheckGeneration(live)
	live = r.NextGeneration
	r, _ = r.CheckGeneration(cp)
	// The live disk now holds a generation that was superseded.
	_, err := r.CheckGeneration(live)
	var gerr *GenerationError
	if !errors.As(err, &gerr) || !gerr.Superseded {
		t.Fatalf("superseded generation: err = %v, want a superseded GenerationError", err)
	}
	if _, err := r.RecordGeneration(live); !errors.Is(err, ErrNotIssued) {
		t.Fatalf("recording a superseded generation: err = %v, want ErrNotIssued", err)
	}
}

// A disk newer than its record (the record restored from a backup, or
// the cluster's etcd rolled back) is accepted, and the count goes on
// from the disk's.
func TestRecordOlderThanDisk(t *testing.T) {
	r := newRecord()
	r.Generation = 3
	got, err := r.CheckGeneration(7)
	if err != nil || got.Generation != 7 || got.NextGeneration != 8 {
		t.Fatalf("CheckGeneration(7) on record 3 = %+v, %v; want generation 7, next 8", got, err)
	}
}

func TestGenerationBounds(t *testing.T) {
	tests := map[string]struct {
		rec       Record
		presented uint64
	}{
		"presented past the bound": {newRecord(), MaxGeneration + 1},
		"presented at the top":     {newRecord(), ^uint64(0)},
		"used up":                  {Record{DiskUUID: "d", Generation: MaxGeneration}, MaxGeneration},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			if r, err := tc.rec.CheckGeneration(tc.presented); err == nil {
				t.Fatalf("accepted, next %d", r.NextGeneration)
			}
		})
	}
	for _, g := range []uint64{0, 5, MaxGeneration} {
		if _, err := newRecord().RecordGeneration(g); !errors.Is(err, ErrNotIssued) {
			t.Errorf("recording %d never issued: err = %v, want ErrNotIssued", g, err)
		}
	}
}

// FuzzGenerations plays a host against the protocol: it copies disks,
// boots any of them, and stops a boot after its check or after its
// write. Whatever it does:
//   - the disk that passed the last check boots again (no lockout);
//   - a disk that misses a boot which ran to its end is refused: its
//     state is older than what the node last ran on;
//   - nothing panics, and every generation is issued once.
func FuzzGenerations(f *testing.F) {
	f.Add([]byte{2, 3, 2, 2, 1, 6, 0, 2, 5})
	f.Add([]byte{3, 1, 1, 1, 6, 2, 5, 9, 1})
	f.Fuzz(func(t *testing.T, ops []byte) {
		r := newRecord()
		// disks hold their generation and the last full boot whose state
		// they carry.
		type disk struct{ gen, run uint64 }
		disks := []disk{{}}
		var runs uint64 // full boots so far
		last := 0       // the disk that passed the last check
		issued := map[uint64]bool{}
		for _, op := range ops {
			i := int(op>>2) % len(disks)
			if op&3 == 3 {
				if len(disks) < 8 {
					disks = append(disks, disks[i])
				}
				continue
			}
			checked, err := r.CheckGeneration(disks[i].gen)
			if i == last && err != nil {
				t.Fatalf("the disk that passed the last check is refused: %v", err)
			}
			if err == nil && disks[i].run != runs {
				t.Fatalf("disk %d, which misses boot %d (it carries boot %d), was accepted", i, runs, disks[i].run)
			}
			if err != nil {
				continue
			}
			r, last = checked, i
			if issued[r.NextGeneration] {
				t.Fatalf("generation %d issued twice", r.NextGeneration)
			}
			issued[r.NextGeneration] = true
			if op&3 == 0 { // stopped before the write
				continue
			}
			disks[i].gen = r.NextGeneration
			if op&3 == 1 { // stopped before the record
				continue
			}
			if r, err = r.RecordGeneration(disks[i].gen); err != nil {
				t.Fatal(err)
			}
			runs++
			disks[i].run = runs
		}
	})
}
