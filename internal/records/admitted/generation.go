package admitted

import (
	"errors"
	"fmt"
)

// A state disk's generation tells the join service whether a rejoining
// node booted the disk it saw last, or an older copy of it: the host can
// swap a node's state disk for a copy it took earlier, which the same key
// opens. The node keeps the generation inside the encrypted disk, where
// the host cannot change it, only roll the whole disk back; the record
// keeps the generation the disk held when its node last booted on it.
//
// At every rejoin, once the ticket's key opened the disk:
//  1. the node presents the generation its disk holds (0 for none), and
//     CheckGeneration accepts it if it is the disk's current one, and
//     issues a next generation, larger than any issued before;
//  2. the node writes the next generation to its disk, synced;
//  3. RecordGeneration records it as the current one, and the node boots
//     on.
//
// The node writes nothing before the check passed. A node that wrote
// first would let the host advance an old copy one step per boot, by
// booting it until it caught up. And each issued generation is new: two
// copies of a disk never both hold a value the record accepts, whichever
// of them the host boots, stops or swaps in between.
//
// A crash or a lost answer never locks a genuine disk out: the disk holds
// either the record's generation or the one last issued (written, not yet
// recorded), and CheckGeneration accepts both. A disk that presents a
// generation above every issued one is newer than the record (the record
// was restored from a backup, or the cluster's etcd was rolled back): it
// is accepted, since no copy the host keeps can hold a value the join
// service never issued.
//
// What it cannot tell: a copy taken while the node ran, after its last
// boot's write, holds the record's generation until the node's next
// rejoin, and passes in its place.

// MaxGeneration is the largest generation a record holds: 2^53-1, which
// every JSON reader (kubectl's included) reads exactly.
const MaxGeneration = 1<<53 - 1

// ErrNotIssued is returned by RecordGeneration for a generation that is
// not the last one CheckGeneration issued for the disk: another boot of
// the disk asked since, or the generation was recorded already. The node
// starts over with the check.
var ErrNotIssued = errors.New("the generation is not the one last issued for this disk")

// GenerationError means a disk presented a generation that is not its
// current one: it is an older copy of the disk.
type GenerationError struct {
	DiskUUID string
	// Presented is what the disk holds; Recorded the record's
	// generation.
	Presented, Recorded uint64
	// Superseded is true if Presented was issued to a boot of the disk
	// and a later check issued another since: a copy of the disk that
	// another copy took over from.
	Superseded bool
}

func (e *GenerationError) Error() string {
	why := "it is an older copy of the disk"
	if e.Superseded {
		why = "another copy of the disk booted since, and was given a later generation"
	}
	disk := "the state disk"
	if e.DiskUUID != "" {
		disk += " " + e.DiskUUID
	}
	return fmt.Sprintf("%s presents generation %d but the cluster recorded %d: %s", disk, e.Presented, e.Recorded, why)
}

// CheckGeneration decides on a disk that presents generation presented at
// a rejoin. It accepts the record's generation, the one last issued (the
// node wrote it and did not record it), and any generation above every
// one issued (the record is older than the disk); it returns the record
// with a newly issued NextGeneration, which the caller stores before
// telling the node. Any other generation is a *GenerationError.
func (r Record) CheckGeneration(presented uint64) (Record, error) {
	issued := max(r.Generation, r.NextGeneration)
	switch {
	case presented > MaxGeneration:
		return Record{}, fmt.Errorf("the state disk presents generation %d, more than %d: no join service issues that", presented, uint64(MaxGeneration))
	case presented < r.Generation:
		return Record{}, &GenerationError{DiskUUID: r.DiskUUID, Presented: presented, Recorded: r.Generation}
	case presented != r.Generation && presented < issued:
		return Record{}, &GenerationError{DiskUUID: r.DiskUUID, Presented: presented, Recorded: r.Generation, Superseded: true}
	}
	if max(issued, presented) >= MaxGeneration {
		return Record{}, fmt.Errorf("disk %s has used up its generations (the last issued is %d): remove the node and create a new one", r.DiskUUID, issued)
	}
	out := r
	// The disk proved it holds presented: a copy holding less is older.
	out.Generation = presented
	out.NextGeneration = max(issued, presented) + 1
	return out, nil
}

// RecordGeneration records that the disk holds g, which must be the
// NextGeneration the last CheckGeneration issued (ErrNotIssued
// otherwise). Recording the current generation again (a retried call
// whose answer was lost) changes nothing.
func (r Record) RecordGeneration(g uint64) (Record, error) {
	if g != 0 && g == r.Generation && r.NextGeneration == 0 {
		return r, nil
	}
	if g == 0 || g != r.NextGeneration {
		return Record{}, fmt.Errorf("record generation %d of disk %s (issued last: %d): %w", g, r.DiskUUID, r.NextGeneration, ErrNotIssued)
	}
	out := r
	out.Generation, out.NextGeneration = g, 0
	return out, nil
}
