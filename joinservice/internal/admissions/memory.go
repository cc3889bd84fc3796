package admissions

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/orrery-dev/orrery/internal/attestation"
	"github.com/orrery-dev/orrery/internal/records/admitted"
)

// Memory is a record of admitted disks held in memory, with Store's
// semantics; tests of the join server use it in the API server's place.
// The zero Memory is empty and ready.
type Memory struct {
	mu      sync.Mutex
	disks   map[string]attestation.Instance
	sets    map[string]string
	removed map[string]string
	// gens are the disks' Generation and NextGeneration.
	gens  map[string][2]uint64
	addrs map[string][]netip.Addr
	// Now is the clock; nil means time.Now.
	Now func() time.Time
}

func (m *Memory) init() {
	if m.disks == nil {
		m.disks, m.sets, m.removed, m.gens, m.addrs = map[string]attestation.Instance{}, map[string]string{}, map[string]string{}, map[string][2]uint64{}, map[string][]netip.Addr{}
	}
}

// Admit records rec, like Store.Admit.
func (m *Memory) Admit(_ context.Context, rec admitted.Record) error {
	if _, err := rec.Object(); err != nil {
		return err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	disk := strings.ToLower(rec.DiskUUID)
	if have, ok := m.disks[disk]; ok && have.ID != rec.Instance.ID {
		return fmt.Errorf("%w (%s)", ErrOtherInstance, have)
	}
	if at, ok := m.removed[disk]; ok {
		return fmt.Errorf("%w at %s", ErrRemoved, at)
	}
	if err := claimsFree(m.list(), rec, (&Store{Now: m.Now}).now()); err != nil {
		return err
	}
	m.init()
	m.disks[disk] = rec.Instance
	m.addrs[disk] = slices.Clone(rec.Addresses)
	if rec.MeasurementSet != "" {
		m.sets[disk] = rec.MeasurementSet
	}
	return nil
}

// List returns every record, like Store.List.
func (m *Memory) List(context.Context) ([]admitted.Record, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.list(), nil
}

func (m *Memory) list() []admitted.Record {
	var recs []admitted.Record
	for disk := range m.disks {
		r, _, _ := m.lookup(disk)
		recs = append(recs, r)
	}
	return recs
}

// Attested records the set the disk's node attested with, like
// Store.Attested.
func (m *Memory) Attested(_ context.Context, diskUUID, set string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	diskUUID = strings.ToLower(diskUUID)
	if _, ok := m.disks[diskUUID]; ok && set != "" {
		m.sets[diskUUID] = set
	}
	return nil
}

// Set returns the set recorded for diskUUID.
func (m *Memory) Set(diskUUID string) string {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.sets[strings.ToLower(diskUUID)]
}

// Remove marks the record of diskUUID removed at at, as 'orrery node
// remove' does; a disk never admitted is recorded as removed all the same.
func (m *Memory) Remove(diskUUID, at string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.init()
	m.removed[strings.ToLower(diskUUID)] = at
}

// Lookup returns the record of diskUUID, like Store.Lookup.
func (m *Memory) Lookup(_ context.Context, diskUUID string) (admitted.Record, bool, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	disk := strings.ToLower(diskUUID)
	return m.lookup(disk)
}

func (m *Memory) lookup(disk string) (admitted.Record, bool, error) {
	inst, ok := m.disks[disk]
	g := m.gens[disk]
	return admitted.Record{DiskUUID: disk, Instance: inst, MeasurementSet: m.sets[disk], RemovedAt: m.removed[disk], Generation: g[0], NextGeneration: g[1], Addresses: slices.Clone(m.addrs[disk])}, ok, nil
}

// CheckGeneration decides on the generation a disk presents, like
// Store.CheckGeneration.
func (m *Memory) CheckGeneration(_ context.Context, diskUUID string, presented uint64) (uint64, error) {
	rec, err := m.update(diskUUID, func(r admitted.Record) (admitted.Record, error) { return r.CheckGeneration(presented) })
	return rec.NextGeneration, err
}

// RecordGeneration records a disk's generation, like
// Store.RecordGeneration.
func (m *Memory) RecordGeneration(_ context.Context, diskUUID string, g uint64) error {
	_, err := m.update(diskUUID, func(r admitted.Record) (admitted.Record, error) { return r.RecordGeneration(g) })
	return err
}

// SetGeneration sets the generations of diskUUID's record, as an owner
// may with kubectl.
func (m *Memory) SetGeneration(diskUUID string, generation, next uint64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.init()
	m.gens[strings.ToLower(diskUUID)] = [2]uint64{generation, next}
}

func (m *Memory) update(diskUUID string, change func(admitted.Record) (admitted.Record, error)) (admitted.Record, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	disk := strings.ToLower(diskUUID)
	rec, ok, _ := m.lookup(disk)
	switch {
	case !ok:
		return admitted.Record{}, fmt.Errorf("disk %s: %w", disk, ErrNotFound)
	case rec.Removed():
		return admitted.Record{}, fmt.Errorf("%w at %s", ErrRemoved, rec.RemovedAt)
	}
	next, err := change(rec)
	if err != nil {
		return admitted.Record{}, err
	}
	m.gens[disk] = [2]uint64{next.Generation, next.NextGeneration}
	return next, nil
}
