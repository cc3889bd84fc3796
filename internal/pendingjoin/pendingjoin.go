// Package pendingjoin keeps a node's join ticket on its state disk while
// the join is past its point of no return and not yet done.
//
// From just before the node lock is taken until kubeadm join has
// finished, the node is locked to the cluster and its state disk is
// re-keyed, so a reboot there makes the initrd rejoin: the node comes
// back locked, and the join service, which hands tickets only to unlocked
// nodes (PCR 15 zero), will not give it another. Without the ticket it
// kept, such a node would start kubelet with no configuration and never
// join. With it, bootstrapperd finishes the join.
//
// The record holds the node's client key and, on a control plane, the
// cluster's CA keys: the same secrets kubeadm join writes to this disk
// anyway, kept in the same encrypted volume, readable by root only, and
// removed once the join is done. Root on a node can write it too, so the
// initrd checks it against its rejoin ticket before the OS starts
// (initrd/internal/keptfiles).
package pendingjoin

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"google.golang.org/protobuf/proto"

	"github.com/orrery-dev/orrery/internal/atomicfile"
	"github.com/orrery-dev/orrery/internal/proto/joinpb"
)

// File is the record's name in the state directory
// (handoff.StateDir).
const File = "pending-join.json"

// record is File's content.
type record struct {
	// Ticket is the joinpb.IssueJoinTicketResponse, protobuf-encoded.
	Ticket []byte `json:"ticket"`
	// ClientKey is the PEM key of the ticket's client certificate.
	ClientKey []byte `json:"clientKey"`
}

// Path is the record's path in stateDir.
func Path(stateDir string) string { return filepath.Join(stateDir, File) }

// Exists reports whether stateDir holds a record.
func Exists(stateDir string) bool {
	_, err := os.Lstat(Path(stateDir))
	return err == nil
}

// Save keeps ticket t and the client certificate's key in stateDir.
func Save(stateDir string, t *joinpb.IssueJoinTicketResponse, key []byte) error {
	ticket, err := proto.Marshal(t)
	if err != nil {
		return err
	}
	b, err := json.Marshal(record{Ticket: ticket, ClientKey: key}) //nolint:gosec // kept 0600 on the encrypted state disk until the join finishes
	if err != nil {
		return err
	}
	if err := atomicfile.WriteFile(Path(stateDir), b, 0o600); err != nil {
		return fmt.Errorf("keep the join ticket until the join is done: %w", err)
	}
	return nil
}

// Load reads the record in stateDir; its error wraps fs.ErrNotExist when
// there is none.
func Load(stateDir string) (*joinpb.IssueJoinTicketResponse, []byte, error) {
	b, err := os.ReadFile(Path(stateDir))
	if err != nil {
		return nil, nil, err
	}
	var r record
	if err := json.Unmarshal(b, &r); err != nil {
		return nil, nil, fmt.Errorf("%s is damaged: %w", Path(stateDir), err)
	}
	var t joinpb.IssueJoinTicketResponse
	if err := proto.Unmarshal(r.Ticket, &t); err != nil {
		return nil, nil, fmt.Errorf("%s holds a damaged ticket: %w", Path(stateDir), err)
	}
	if len(r.ClientKey) == 0 {
		return nil, nil, fmt.Errorf("%s holds no client key", Path(stateDir))
	}
	return &t, r.ClientKey, nil
}

// Remove removes the record; none is not an error.
func Remove(stateDir string) error {
	if err := os.Remove(Path(stateDir)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("remove the finished join's ticket: %w", err)
	}
	return nil
}
