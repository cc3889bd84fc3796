package joinclient

import (
	"context"
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

// PendingFile, in Config.StateDir, holds the join ticket in use from
// just before the node lock is taken until kubeadm join has finished.
//
// Between those two points the node is locked to the cluster and its
// state disk is re-keyed, so a reboot there makes the initrd rejoin: the
// node comes back locked, and the join service, which hands tickets only
// to unlocked nodes (PCR 15 zero), will not give it another. Without the
// ticket it kept, such a node would start kubelet with no configuration
// and never join. With it, bootstrapperd finishes the join (Finish).
//
// The record holds the node's client key and, on a control plane, the
// cluster's CA keys: the same secrets kubeadm join writes to this disk
// anyway, kept in the same encrypted volume, readable by root only, and
// removed once the join is done.
const PendingFile = "pending-join.json"

// pending is PendingFile's content.
type pending struct {
	// Ticket is the joinpb.IssueJoinTicketResponse, protobuf-encoded.
	Ticket []byte `json:"ticket"`
	// ClientKey is the PEM key of the ticket's client certificate.
	ClientKey []byte `json:"clientKey"`
}

func pendingPath(stateDir string) string { return filepath.Join(stateDir, PendingFile) }

// HasPending reports whether a join was interrupted after its point of no
// return: Finish completes it.
func HasPending(stateDir string) bool {
	_, err := os.Stat(pendingPath(stateDir))
	return err == nil
}

func savePending(stateDir string, t *joinpb.IssueJoinTicketResponse, key []byte) error {
	ticket, err := proto.Marshal(t)
	if err != nil {
		return err
	}
	b, err := json.Marshal(pending{Ticket: ticket, ClientKey: key})
	if err != nil {
		return err
	}
	if err := atomicfile.WriteFile(pendingPath(stateDir), b, 0o600); err != nil {
		return fmt.Errorf("keep the join ticket until the join is done: %w", err)
	}
	return nil
}

func loadPending(stateDir string) (*joinpb.IssueJoinTicketResponse, []byte, error) {
	b, err := os.ReadFile(pendingPath(stateDir))
	if err != nil {
		return nil, nil, err
	}
	var p pending
	if err := json.Unmarshal(b, &p); err != nil {
		return nil, nil, fmt.Errorf("%s is damaged: %w", pendingPath(stateDir), err)
	}
	var t joinpb.IssueJoinTicketResponse
	if err := proto.Unmarshal(p.Ticket, &t); err != nil {
		return nil, nil, fmt.Errorf("%s holds a damaged ticket: %w", pendingPath(stateDir), err)
	}
	if len(p.ClientKey) == 0 {
		return nil, nil, fmt.Errorf("%s holds no client key", pendingPath(stateDir))
	}
	return &t, p.ClientKey, nil
}

func removePending(stateDir string) error {
	if err := os.Remove(pendingPath(stateDir)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("remove the finished join's ticket: %w", err)
	}
	return nil
}

// Finish completes a join that failed, or that a reboot interrupted,
// after the node lock (see PendingFile), with the ticket it kept: kubeadm
// reset, then kubeadm join again, retried with backoff until it succeeds
// or ctx ends. It
// returns ErrNoPendingJoin when there is nothing to finish, and
// ErrLockLost when the node is locked to another cluster than the
// ticket's.
func Finish(ctx context.Context, cfg Config) error {
	cfg, log, status := cfg.withDefaults()
	ticket, key, err := loadPending(cfg.StateDir)
	if errors.Is(err, fs.ErrNotExist) {
		return ErrNoPendingJoin
	}
	if err != nil {
		return err
	}
	log.Info("finishing this node's join with the ticket kept on the state disk: the node is locked to the cluster, so the join service gives it no other", "phase", "join")
	return retry(ctx, cfg, log, "the interrupted join has not finished yet; retrying", func() error {
		self, err := cfg.Metadata.Self(ctx)
		if err != nil {
			return fmt.Errorf("ask the metadata service who this node is: %w", err)
		}
		return apply(ctx, cfg, log, status, self, key, ticket)
	})
}

// ErrNoPendingJoin means there is no interrupted join to finish.
var ErrNoPendingJoin = errors.New("no interrupted join to finish")
