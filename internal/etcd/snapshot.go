package etcd

import (
	"context"
	"errors"
	"fmt"
	"io"

	"github.com/orrery-dev/orrery/internal/proto/etcdpb"
)

// Stream takes a snapshot and hands each part to send, with what the
// member says is still to come. The last part is the database's SHA-256,
// which Check verifies.
func (m Member) Stream(ctx context.Context, send func(data []byte, remaining uint64) error) error {
	conn, err := m.dial()
	if err != nil {
		return err
	}
	defer conn.Close()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	// A snapshot is as large as the database: etcd sends it in parts of
	// 32 KiB.
	stream, err := etcdpb.NewMaintenanceClient(conn).Snapshot(ctx, &etcdpb.SnapshotRequest{})
	if err != nil {
		return fmt.Errorf("ask etcd at %s for a snapshot: %w", m.Endpoint, err)
	}
	for {
		r, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("etcd's snapshot from %s: %w", m.Endpoint, err)
		}
		if err := send(r.GetBlob(), r.GetRemainingBytes()); err != nil {
			return err
		}
	}
}
