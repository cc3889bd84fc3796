package admissions

import (
	"context"
	"fmt"
	"strings"
	"sync"

	"github.com/orrery-dev/orrery/internal/admitted"
	"github.com/orrery-dev/orrery/internal/attestation"
)

// Memory is a record of admitted disks held in memory, with Store's
// semantics; tests of the join server use it in the API server's place.
// The zero Memory is empty and ready.
type Memory struct {
	mu      sync.Mutex
	disks   map[string]attestation.Instance
	sets    map[string]string
	removed map[string]string
}

// Admit records diskUUID for inst, like Store.Admit.
func (m *Memory) Admit(_ context.Context, diskUUID string, inst attestation.Instance, set string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	diskUUID = strings.ToLower(diskUUID)
	if have, ok := m.disks[diskUUID]; ok && have.ID != inst.ID {
		return fmt.Errorf("%w (%s)", ErrOtherInstance, have)
	}
	if at, ok := m.removed[diskUUID]; ok {
		return fmt.Errorf("%w at %s", ErrRemoved, at)
	}
	if m.disks == nil {
		m.disks, m.sets, m.removed = map[string]attestation.Instance{}, map[string]string{}, map[string]string{}
	}
	m.disks[diskUUID] = inst
	if set != "" {
		m.sets[diskUUID] = set
	}
	return nil
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
	if m.disks == nil {
		m.disks, m.sets, m.removed = map[string]attestation.Instance{}, map[string]string{}, map[string]string{}
	}
	m.removed[strings.ToLower(diskUUID)] = at
}

// Lookup returns the record of diskUUID, like Store.Lookup.
func (m *Memory) Lookup(_ context.Context, diskUUID string) (admitted.Record, bool, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	disk := strings.ToLower(diskUUID)
	inst, ok := m.disks[disk]
	return admitted.Record{DiskUUID: disk, Instance: inst, MeasurementSet: m.sets[disk], RemovedAt: m.removed[disk]}, ok, nil
}
