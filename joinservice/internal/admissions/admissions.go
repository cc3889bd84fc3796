// Package admissions keeps the cluster's record of admitted nodes (see
// internal/records/admitted for the format) in the API server: one AdmittedNode per
// state disk, created when the join service admits the disk's node, read
// when a node asks to rejoin with that disk, and updated with the
// measurement set the node attested with and the disk's generation.
package admissions

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/netip"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/orrery-dev/orrery/internal/records/admitted"
	"github.com/orrery-dev/orrery/internal/records/orreryapi"
	"github.com/orrery-dev/orrery/joinservice/internal/apiserver"
)

// Store reads and writes records through the API server.
type Store struct {
	Conn *apiserver.Conn
	// Now is the clock; nil means time.Now.
	Now func() time.Time
}

func (s *Store) now() time.Time {
	if s.Now == nil {
		return time.Now()
	}
	return s.Now()
}

// ErrOtherInstance is returned by Admit for a disk recorded for another VM.
var ErrOtherInstance = errors.New("the disk was admitted for another VM")

// ErrRemoved is returned by Admit for a disk whose node the owner removed.
var ErrRemoved = errors.New("the owner removed the disk's node from the cluster ('orrery node remove')")

func path(name string) string {
	return orreryapi.Path(orreryapi.AdmittedNodes, url.PathEscape(name))
}

// Lookup returns the record of diskUUID: the VM it was admitted for, and
// whether the owner removed that node; found is false if the cluster has
// no record of the disk.
func (s *Store) Lookup(ctx context.Context, diskUUID string) (rec admitted.Record, found bool, err error) {
	name, err := admitted.Name(diskUUID)
	if err != nil {
		return admitted.Record{}, false, err
	}
	code, body, err := s.Conn.Do(ctx, http.MethodGet, path(name), nil)
	if err != nil {
		return admitted.Record{}, false, fmt.Errorf("read the record of disk %s: %w", diskUUID, err)
	}
	switch code {
	case http.StatusOK:
	case http.StatusNotFound:
		return admitted.Record{}, false, nil
	default:
		return admitted.Record{}, false, fmt.Errorf("read the record of disk %s: API server answered %d %s: %s", diskUUID, code, http.StatusText(code), apiserver.Excerpt(body))
	}
	rec, err = admitted.Parse(diskUUID, body)
	if err != nil {
		return admitted.Record{}, false, err
	}
	return rec, true, nil
}

// Admit records rec: its disk belongs to its instance, which attested
// with its measurement set and stated its addresses. A disk already
// recorded for that instance is fine (a retried join: its set and
// addresses are written again); one recorded for another VM gives
// ErrOtherInstance, one whose node the owner removed ErrRemoved. An
// address or the name recorded for another VM whose node was not removed
// gives ErrAddressTaken or ErrNameTaken, and nothing is written.
func (s *Store) Admit(ctx context.Context, rec admitted.Record) error {
	obj, err := rec.Object()
	if err != nil {
		return err
	}
	all, err := s.List(ctx)
	if err != nil {
		return err
	}
	for _, have := range all {
		if strings.EqualFold(have.DiskUUID, rec.DiskUUID) && have.Instance.ID != rec.Instance.ID {
			return fmt.Errorf("%w (%s)", ErrOtherInstance, have.Instance)
		}
	}
	if err := claimsFree(all, rec, s.now()); err != nil {
		return err
	}
	if err := s.claim(ctx, rec); err != nil {
		return err
	}
	code, body, err := s.Conn.Do(ctx, http.MethodPost, orreryapi.Path(orreryapi.AdmittedNodes, ""), obj)
	if err != nil {
		return fmt.Errorf("record disk %s as admitted: %w", rec.DiskUUID, err)
	}
	switch code {
	case http.StatusCreated:
		return nil
	case http.StatusConflict:
		// Recorded before: by this VM's earlier attempt, or another's.
		have, found, err := s.Lookup(ctx, rec.DiskUUID)
		if err != nil {
			return err
		}
		if !found || have.Instance.ID != rec.Instance.ID {
			return fmt.Errorf("%w (%s)", ErrOtherInstance, have.Instance)
		}
		if have.Removed() {
			return fmt.Errorf("%w at %s", ErrRemoved, have.RemovedAt)
		}
		spec := map[string]any{"addresses": admitted.FormatAddresses(rec.Addresses)}
		if rec.MeasurementSet != "" {
			spec["measurementSet"] = rec.MeasurementSet
		}
		return s.patchSpec(ctx, rec.DiskUUID, "the measurement set and addresses", spec)
	default:
		return fmt.Errorf("record disk %s as admitted: API server answered %d %s: %s", rec.DiskUUID, code, http.StatusText(code), apiserver.Excerpt(body))
	}
}

// Attested records that the node of diskUUID attested with measurement set
// set (for 'orrery status' and for retiring sets no node runs).
func (s *Store) Attested(ctx context.Context, diskUUID, set string) error {
	if set == "" {
		return nil
	}
	return s.patchSpec(ctx, diskUUID, "the measurement set", map[string]any{"measurementSet": set})
}

// patchSpec merges spec into the spec of diskUUID's record; what names
// the fields for an error.
func (s *Store) patchSpec(ctx context.Context, diskUUID, what string, spec map[string]any) error {
	name, err := admitted.Name(diskUUID)
	if err != nil {
		return err
	}
	code, body, err := s.Conn.DoPatch(ctx, path(name), map[string]any{"spec": spec})
	if err != nil {
		return fmt.Errorf("record %s of disk %s: %w", what, diskUUID, err)
	}
	if code != http.StatusOK {
		return fmt.Errorf("record %s of disk %s: API server answered %d %s: %s", what, diskUUID, code, http.StatusText(code), apiserver.Excerpt(body))
	}
	return nil
}

// listPage bounds each answer of List's: the API server's answers are
// read up to 1 MiB, and a record is about 500 bytes.
var listPage = 500

// List returns every record the cluster holds, a page at a time. A
// record that does not parse is left out (it is named in the error of
// any call that reads it alone): one bad record must not stop every
// join.
func (s *Store) List(ctx context.Context) ([]admitted.Record, error) {
	var all []admitted.Record
	next := ""
	for {
		q := url.Values{"limit": {strconv.Itoa(listPage)}}
		if next != "" {
			q.Set("continue", next)
		}
		code, body, err := s.Conn.Do(ctx, http.MethodGet, orreryapi.Path(orreryapi.AdmittedNodes, "")+"?"+q.Encode(), nil)
		if err != nil {
			return nil, fmt.Errorf("list the admitted nodes: %w", err)
		}
		if code != http.StatusOK {
			return nil, fmt.Errorf("list the admitted nodes: API server answered %d %s: %s", code, http.StatusText(code), apiserver.Excerpt(body))
		}
		recs, err := admitted.ParseList(body)
		var bad *admitted.BadItemsError
		if err != nil && !errors.As(err, &bad) {
			return nil, err
		}
		all = append(all, recs...)
		var page struct {
			Metadata struct {
				Continue string `json:"continue"`
			} `json:"metadata"`
		}
		_ = json.Unmarshal(body, &page)
		if next = page.Metadata.Continue; next == "" {
			return all, nil
		}
	}
}

// ErrAddressTaken is returned by Admit for an address recorded for
// another VM whose node the owner has not removed.
var ErrAddressTaken = errors.New("the address is recorded for another node")

// ErrNameTaken is returned by Admit for a node name recorded for another
// VM whose node the owner has not removed.
var ErrNameTaken = errors.New("the node name is recorded for another VM")

// claimsFree checks that neither rec's name nor any of its addresses is
// recorded for another VM in all: root on a node must not get its
// kubelet a serving certificate for a neighbour's address, or a second
// client certificate in a neighbour's name, by joining a second VM under
// it. A node the owner removed holds its name and its addresses until its
// serving certificate for them may have expired
// (admitted.Record.HeldUntil), since nothing revokes it; the removed list
// refuses the name for good once 'orrery node remove' wrote it, but that
// comes after the drain, and a VM admitted under the name before then
// would have the removed kubelet's requests approved for its addresses.
func claimsFree(all []admitted.Record, rec admitted.Record, now time.Time) error {
	for _, other := range all {
		if other.Instance.ID == rec.Instance.ID {
			continue
		}
		if !addressHeld(other, now) {
			continue
		}
		if other.Instance.Name == rec.Instance.Name {
			if other.Removed() {
				until, ok := other.HeldUntil()
				return fmt.Errorf("%w: it was %s's (state disk %s), which the owner removed at %s; it is not handed to another VM before %s", ErrNameTaken, other.Instance, other.DiskUUID, other.RemovedAt, heldUntil(until, ok))
			}
			return fmt.Errorf("%w: %s (state disk %s)", ErrNameTaken, other.Instance, other.DiskUUID)
		}
		for _, a := range rec.Addresses {
			if slices.Contains(other.Addresses, a) {
				return addressTaken(a, other)
			}
		}
	}
	return nil
}

// addressHeld reports whether the addresses of other are still its own
// at now: while its node is in the cluster, and after the owner removed
// it until its serving certificate may have expired.
func addressHeld(other admitted.Record, now time.Time) bool {
	if !other.Removed() {
		return true
	}
	until, ok := other.HeldUntil()
	return !ok || now.Before(until)
}

// addressTaken is the error for address a, which other holds.
func addressTaken(a netip.Addr, other admitted.Record) error {
	if !other.Removed() {
		return fmt.Errorf("%w: %s belongs to %s (state disk %s)", ErrAddressTaken, a, other.Instance, other.DiskUUID)
	}
	until, ok := other.HeldUntil()
	return fmt.Errorf("%w: %s was %s's (state disk %s), which the owner removed at %s; its kubelet's serving certificate for it may be valid until %s, and the address is not handed to another node before then",
		ErrAddressTaken, a, other.Instance, other.DiskUUID, other.RemovedAt, heldUntil(until, ok))
}

func heldUntil(t time.Time, ok bool) string {
	if !ok {
		return "no known time (its removal time does not parse)"
	}
	return t.UTC().Format(time.RFC3339)
}

// ErrNotFound is returned by CheckGeneration and RecordGeneration for a
// disk the cluster has no record of.
var ErrNotFound = errors.New("the cluster has no record of the disk")

// CheckGeneration decides on the generation a rejoining node's disk
// presents (admitted.Record.CheckGeneration) and stores the generation it
// issues, which it returns, before the node may write it. It fails with
// an *admitted.GenerationError for an older copy of the disk, and
// ErrRemoved or ErrNotFound for a disk with no record to rejoin with.
func (s *Store) CheckGeneration(ctx context.Context, diskUUID string, presented uint64) (uint64, error) {
	rec, err := s.update(ctx, diskUUID, func(r admitted.Record) (admitted.Record, error) { return r.CheckGeneration(presented) })
	return rec.NextGeneration, err
}

// RecordGeneration records that diskUUID holds generation g, the one
// CheckGeneration issued last (admitted.ErrNotIssued otherwise).
func (s *Store) RecordGeneration(ctx context.Context, diskUUID string, g uint64) error {
	_, err := s.update(ctx, diskUUID, func(r admitted.Record) (admitted.Record, error) { return r.RecordGeneration(g) })
	return err
}

// updateAttempts bounds how often update reads a record again after
// another writer changed it between its read and its write.
const updateAttempts = 5

// update reads the record of diskUUID, applies change, and writes the
// generations it returns, on the condition that nobody wrote the record
// in between (its resourceVersion): two rejoins of one disk never both
// act on the same read. It returns the record as written.
func (s *Store) update(ctx context.Context, diskUUID string, change func(admitted.Record) (admitted.Record, error)) (admitted.Record, error) {
	name, err := admitted.Name(diskUUID)
	if err != nil {
		return admitted.Record{}, err
	}
	for range updateAttempts {
		rec, version, err := s.read(ctx, diskUUID, name)
		if err != nil {
			return admitted.Record{}, err
		}
		if rec.Removed() {
			return admitted.Record{}, fmt.Errorf("%w at %s", ErrRemoved, rec.RemovedAt)
		}
		next, err := change(rec)
		if err != nil {
			return admitted.Record{}, err
		}
		if next.Generation == rec.Generation && next.NextGeneration == rec.NextGeneration {
			return next, nil
		}
		code, body, err := s.Conn.DoPatch(ctx, path(name), generationPatch(version, next))
		if err != nil {
			return admitted.Record{}, fmt.Errorf("record the generation of disk %s: %w", diskUUID, err)
		}
		switch code {
		case http.StatusOK:
			return next, checkKept(diskUUID, body, next)
		case http.StatusConflict:
			continue
		default:
			return admitted.Record{}, fmt.Errorf("record the generation of disk %s: API server answered %d %s: %s", diskUUID, code, http.StatusText(code), apiserver.Excerpt(body))
		}
	}
	return admitted.Record{}, fmt.Errorf("record the generation of disk %s: the record changed under every one of %d attempts; ask again", diskUUID, updateAttempts)
}

// checkKept checks that the record the API server answered a write with
// holds the generations written: an AdmittedNode CRD older than them
// drops unknown fields without a word, and the disk's generation would
// never be kept.
func checkKept(diskUUID string, body []byte, want admitted.Record) error {
	got, err := admitted.Parse(diskUUID, body)
	if err != nil {
		return fmt.Errorf("read back the record of disk %s: %w", diskUUID, err)
	}
	if got.Generation != want.Generation || got.NextGeneration != want.NextGeneration {
		return fmt.Errorf("the API server did not keep the generation of disk %s (it holds %d, next %d; written %d, next %d): the AdmittedNode CRD is older than the join service; upgrade the orrery-crds chart ('orrery upgrade apply')",
			diskUUID, got.Generation, got.NextGeneration, want.Generation, want.NextGeneration)
	}
	return nil
}

// generationPatch is a merge patch that writes rec's generations if the
// object is still at resourceVersion version; a NextGeneration of 0
// removes the field.
func generationPatch(version string, rec admitted.Record) map[string]any {
	var next any
	if rec.NextGeneration != 0 {
		next = rec.NextGeneration
	}
	return map[string]any{
		"metadata": map[string]any{"resourceVersion": version},
		"spec":     map[string]any{"generation": rec.Generation, "nextGeneration": next},
	}
}

// read returns the record of diskUUID, stored as name, and its
// resourceVersion.
func (s *Store) read(ctx context.Context, diskUUID, name string) (admitted.Record, string, error) {
	code, body, err := s.Conn.Do(ctx, http.MethodGet, path(name), nil)
	if err != nil {
		return admitted.Record{}, "", fmt.Errorf("read the record of disk %s: %w", diskUUID, err)
	}
	switch code {
	case http.StatusOK:
	case http.StatusNotFound:
		return admitted.Record{}, "", fmt.Errorf("disk %s: %w", diskUUID, ErrNotFound)
	default:
		return admitted.Record{}, "", fmt.Errorf("read the record of disk %s: API server answered %d %s: %s", diskUUID, code, http.StatusText(code), apiserver.Excerpt(body))
	}
	rec, err := admitted.Parse(diskUUID, body)
	if err != nil {
		return admitted.Record{}, "", err
	}
	var meta struct {
		Metadata struct {
			ResourceVersion string `json:"resourceVersion"`
		} `json:"metadata"`
	}
	if err := json.Unmarshal(body, &meta); err != nil || meta.Metadata.ResourceVersion == "" {
		return admitted.Record{}, "", fmt.Errorf("the record of disk %s has no resourceVersion", diskUUID)
	}
	return rec, meta.Metadata.ResourceVersion, nil
}
