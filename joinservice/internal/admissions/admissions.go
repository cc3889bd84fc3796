// Package admissions keeps the cluster's record of admitted nodes (see
// internal/admitted for the format) in the API server: one AdmittedNode per
// state disk, created when the join service admits the disk's node, read
// when a node asks to rejoin with that disk, and updated with the
// measurement set the node attested with.
package admissions

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"

	"github.com/orrery-dev/orrery/internal/admitted"
	"github.com/orrery-dev/orrery/internal/attestation"
	"github.com/orrery-dev/orrery/internal/orreryapi"
	"github.com/orrery-dev/orrery/joinservice/internal/apiserver"
)

// Store reads and writes records through the API server.
type Store struct {
	Conn *apiserver.Conn
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

// Admit records that diskUUID belongs to inst, which attested with
// measurement set set. A disk already recorded for inst is fine (a
// retried join); one recorded for another VM gives ErrOtherInstance, one
// whose node the owner removed ErrRemoved.
func (s *Store) Admit(ctx context.Context, diskUUID string, inst attestation.Instance, set string) error {
	obj, err := admitted.Record{DiskUUID: diskUUID, Instance: inst, MeasurementSet: set}.Object()
	if err != nil {
		return err
	}
	code, body, err := s.Conn.Do(ctx, http.MethodPost, orreryapi.Path(orreryapi.AdmittedNodes, ""), obj)
	if err != nil {
		return fmt.Errorf("record disk %s as admitted: %w", diskUUID, err)
	}
	switch code {
	case http.StatusCreated:
		return nil
	case http.StatusConflict:
		// Recorded before: by this VM's earlier attempt, or another's.
		have, found, err := s.Lookup(ctx, diskUUID)
		if err != nil {
			return err
		}
		if !found || have.Instance.ID != inst.ID {
			return fmt.Errorf("%w (%s)", ErrOtherInstance, have.Instance)
		}
		if have.Removed() {
			return fmt.Errorf("%w at %s", ErrRemoved, have.RemovedAt)
		}
		return s.Attested(ctx, diskUUID, set)
	default:
		return fmt.Errorf("record disk %s as admitted: API server answered %d %s: %s", diskUUID, code, http.StatusText(code), apiserver.Excerpt(body))
	}
}

// Attested records that the node of diskUUID attested with measurement set
// set (for 'orrery status' and for retiring sets no node runs).
func (s *Store) Attested(ctx context.Context, diskUUID, set string) error {
	if set == "" {
		return nil
	}
	name, err := admitted.Name(diskUUID)
	if err != nil {
		return err
	}
	patch := map[string]any{"spec": map[string]any{"measurementSet": set}}
	code, body, err := s.Conn.DoPatch(ctx, path(name), patch)
	if err != nil {
		return fmt.Errorf("record the measurement set of disk %s: %w", diskUUID, err)
	}
	if code != http.StatusOK {
		return fmt.Errorf("record the measurement set of disk %s: API server answered %d %s: %s", diskUUID, code, http.StatusText(code), apiserver.Excerpt(body))
	}
	return nil
}
