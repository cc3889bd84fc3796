package joinclient

import (
	"context"
	"errors"
	"fmt"
	"io/fs"

	"github.com/orrery-dev/orrery/internal/disk/handoff"
	"github.com/orrery-dev/orrery/internal/pendingjoin"
)

// Finish completes a join that failed, or that a reboot interrupted,
// after the node lock (see internal/pendingjoin), with the ticket it kept: kubeadm
// reset, then kubeadm join again, retried with backoff until it succeeds
// or ctx ends. It
// returns ErrNoPendingJoin when there is nothing to finish, and
// ErrLockLost when the node is locked to another cluster than the
// ticket's.
func Finish(ctx context.Context, cfg Config) error {
	cfg, log, status := cfg.withDefaults()
	ticket, key, err := pendingjoin.Load(cfg.StateDir)
	if errors.Is(err, fs.ErrNotExist) {
		return ErrNoPendingJoin
	}
	if err != nil {
		return err
	}
	log.Info("finishing this node's join with the ticket kept on the state disk: the node is locked to the cluster, so the join service gives it no other", "phase", "join")
	if cfg.ClusterVersionFile != "" {
		if v, err := handoff.ReadClusterVersion(cfg.ClusterVersionFile); err == nil {
			ticket.KubernetesVersion = v
		}
	}
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
