package main

import (
	"context"
	"fmt"
	"path/filepath"
	"time"

	"github.com/orrery-dev/orrery/initrd/internal/diskgen"
	"github.com/orrery-dev/orrery/initrd/internal/unlock"
	"github.com/orrery-dev/orrery/internal/joinconn"
	"github.com/orrery-dev/orrery/internal/metadata"
	"github.com/orrery-dev/orrery/internal/proto/joinpb"
)

// checkGeneration proves to a join service of the node's own cluster
// (clusterID) that the state disk a rejoin ticket's key opened is not an
// older copy of itself, advancing the disk's generation (diskgen). A
// refused disk fails the boot, with the join service's word on what to
// do. A key from the owner's recovery comes with no join service to ask:
// the disk's generation is then left as it is, and checked at the next
// rejoin.
func checkGeneration(ctx context.Context, c *console, joins *joinconn.Dialer, meta *metadata.Client, uuid string, clusterID []byte, key unlock.Key) error {
	say := func(format string, args ...any) { c.log("generation", format, args...) }
	if key.JoinService == "" {
		say("the disk key came from %s, not from a join service: this boot does not check that the state disk is its latest copy (the next rejoin does)", key.From)
		return nil
	}
	own, err := joins.OfCluster(clusterID)
	if err != nil {
		return err
	}
	t := time.Now()
	chk := &diskgen.Checker{
		JoinService: own, DiskUUID: uuid, Path: filepath.Join(sysroot, diskgen.File),
		First:  key.JoinService,
		Others: func(ctx context.Context) ([]string, error) { return otherControlPlanes(ctx, meta) },
		Say:    say,
	}
	if err := chk.Run(ctx); err != nil {
		return fmt.Errorf("state disk generation: %w", err)
	}
	say("checked in %s", since(t))
	return nil
}

// otherControlPlanes are the join services the metadata service leads
// to, but this node's.
func otherControlPlanes(ctx context.Context, meta *metadata.Client) ([]string, error) {
	_, services, err := metadata.JoinServices(ctx, meta, joinpb.Port)
	if err != nil {
		return nil, err
	}
	var out []string
	for _, s := range services {
		out = append(out, s.Addr.String())
	}
	return out, nil
}
