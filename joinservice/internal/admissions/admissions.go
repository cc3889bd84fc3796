// Package admissions keeps the cluster's record of admitted nodes (see
// internal/admitted for the format) in the API server: one ConfigMap per
// state disk, created when the join service admits the disk's node and
// read when a node asks to rejoin with that disk.
package admissions

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"

	"github.com/orrery-dev/orrery/internal/admitted"
	"github.com/orrery-dev/orrery/internal/attestation"
	"github.com/orrery-dev/orrery/joinservice/internal/apiserver"
)

// Store reads and writes records through the API server.
type Store struct {
	Conn *apiserver.Conn
}

// ErrOtherInstance is returned by Admit for a disk recorded for another VM.
var ErrOtherInstance = errors.New("the disk was admitted for another VM")

func path(name string) string {
	return "/api/v1/namespaces/" + admitted.Namespace + "/configmaps/" + url.PathEscape(name)
}

// Lookup returns the VM diskUUID was admitted for; found is false if the
// cluster has no record of the disk.
func (s *Store) Lookup(ctx context.Context, diskUUID string) (inst attestation.Instance, found bool, err error) {
	name, err := admitted.Name(diskUUID)
	if err != nil {
		return attestation.Instance{}, false, err
	}
	code, body, err := s.Conn.Do(ctx, http.MethodGet, path(name), nil)
	if err != nil {
		return attestation.Instance{}, false, fmt.Errorf("read the record of disk %s: %w", diskUUID, err)
	}
	switch code {
	case http.StatusOK:
	case http.StatusNotFound:
		return attestation.Instance{}, false, nil
	default:
		return attestation.Instance{}, false, fmt.Errorf("read the record of disk %s: API server answered %d %s: %s", diskUUID, code, http.StatusText(code), apiserver.Excerpt(body))
	}
	var cm struct {
		Data map[string]string `json:"data"`
	}
	if err := json.Unmarshal(body, &cm); err != nil {
		return attestation.Instance{}, false, fmt.Errorf("decode the record of disk %s: %w", diskUUID, err)
	}
	rec, err := admitted.Parse(diskUUID, cm.Data)
	if err != nil {
		return attestation.Instance{}, false, err
	}
	return rec.Instance, true, nil
}

// Admit records that diskUUID belongs to inst. A disk already recorded
// for inst is fine (a retried join); one recorded for another VM gives
// ErrOtherInstance.
func (s *Store) Admit(ctx context.Context, diskUUID string, inst attestation.Instance) error {
	cm, err := admitted.Record{DiskUUID: diskUUID, Instance: inst}.ConfigMap()
	if err != nil {
		return err
	}
	code, body, err := s.Conn.Do(ctx, http.MethodPost, "/api/v1/namespaces/"+admitted.Namespace+"/configmaps", cm)
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
		if !found || have.ID != inst.ID {
			return fmt.Errorf("%w (%s)", ErrOtherInstance, have)
		}
		return nil
	default:
		return fmt.Errorf("record disk %s as admitted: API server answered %d %s: %s", diskUUID, code, http.StatusText(code), apiserver.Excerpt(body))
	}
}
