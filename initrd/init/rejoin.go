package main

import (
	"context"
	"crypto/ed25519"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
	"google.golang.org/grpc"

	"github.com/orrery-dev/orrery/initrd/internal/keptfiles"
	"github.com/orrery-dev/orrery/initrd/internal/netup"
	"github.com/orrery-dev/orrery/initrd/internal/statedisk"
	"github.com/orrery-dev/orrery/initrd/internal/unlock"
	"github.com/orrery-dev/orrery/internal/atls"
	"github.com/orrery-dev/orrery/internal/attestation/nodeattest"
	"github.com/orrery-dev/orrery/internal/attestation/qemu"
	"github.com/orrery-dev/orrery/internal/attestation/vtpm"
	"github.com/orrery-dev/orrery/internal/disk/cryptsetup"
	"github.com/orrery-dev/orrery/internal/disk/handoff"
	"github.com/orrery-dev/orrery/internal/inspectserver"
	"github.com/orrery-dev/orrery/internal/joinconn"
	"github.com/orrery-dev/orrery/internal/keys"
	"github.com/orrery-dev/orrery/internal/metadata"
	"github.com/orrery-dev/orrery/internal/nodelock"
	"github.com/orrery-dev/orrery/internal/owneraccess"
	"github.com/orrery-dev/orrery/internal/proto/inspectpb"
	"github.com/orrery-dev/orrery/internal/proto/recoverpb"
	"github.com/orrery-dev/orrery/internal/role"
	"github.com/orrery-dev/orrery/internal/tpm/pcrlog"
	"github.com/orrery-dev/orrery/internal/tpm/tpmdev"
)

const (
	// metadataURL is the platform's metadata service, as bootstrapperd
	// reaches it.
	metadataURL = metadata.DefaultBaseURL
	// dhcpTimeout bounds one DHCP attempt; the initrd tries until it
	// gets a lease.
	dhcpTimeout = 30 * time.Second
)

// unlockState opens the initialised state disk dev on a later boot: with
// the key a join service gives it (rejoin), or, on a control plane, the
// one the owner's master secret gives (recovery), whichever comes first.
// Then it mounts the disk, locks the node to its cluster (PCR 15, as at
// its first join) and takes the network down again for the OS. A disk
// the Unlocker refuses (its header, or the mapping it makes, is not what
// Orrery formats) fails the boot, whenever that shows.
func unlockState(ctx context.Context, c *console, tool *cryptsetup.Tool, mlog *pcrlog.Log, dev string) error {
	start := time.Now()
	u := &unlock.Unlocker{LUKS: tool, Device: dev, MapperName: statedisk.MapperName, KeyDir: "/run/orrery"}
	// The copy of the header that every key will be tried with, checked
	// before the network comes up: a host that rewrote the header since
	// Prepare read it is refused here.
	if err := u.Check(ctx); err != nil {
		return refused(err)
	}
	// Read from the disk, not from the checked copy: a UUID the host
	// changed since only asks for a key that does not open the copy.
	uuid, err := tool.UUID(ctx, dev)
	if err != nil {
		return fmt.Errorf("read the state disk's LUKS UUID: %w", err)
	}
	c.log("state", "state disk %s is initialised (LUKS UUID %s); getting its key from the cluster", dev, uuid)
	owner := headerOwner(ctx, c, tool, dev)
	lease := networkUp(ctx, c)
	bootCtx := ctx // outlives the wait for the key, for the generation check
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	meta := &metadata.Client{BaseURL: metadataURL}
	platform, err := detectPlatform(ctx, c, meta)
	if err != nil {
		return err
	}
	issuer, err := platform.Issuer(qemu.IssuerConfig{OpenTPM: tpmdev.Open, FirmwareEventLogPath: vtpm.DefaultFirmwareEventLogPath, MeasurementLog: mlog})
	if err != nil {
		return err
	}
	joins, err := joinServiceDialer(issuer, platform)
	if err != nil {
		return err
	}
	say := func(format string, args ...any) { c.log("rejoin", format, args...) }
	rejoin := &unlock.Rejoiner{Metadata: meta, JoinService: joins, DiskUUID: uuid, Unlocker: u, Say: say}
	rejoined := make(chan error, 1)
	go func() { rejoined <- rejoin.Run(ctx) }()
	stopRecovery := serveWhileWaiting(ctx, c, meta, issuer, uuid, u, owner)

	err = awaitKey(u.Opened(), rejoined)
	stopRecovery()
	cancel()
	if err != nil {
		return err
	}
	key := u.Key()
	c.log("state", "state disk opened with the key from %s in %s", key.From, since(start))

	p := &statedisk.Preparer{LUKS: tool, Mount: unix.Mount, Sysroot: sysroot}
	if err := p.MountState(filepath.Join("/dev/mapper", statedisk.MapperName)); err != nil {
		return err
	}
	salt, err := handoff.ReadMeasurementSalt(filepath.Join(sysroot, handoff.MeasurementSaltFile))
	if err != nil {
		return err
	}
	clusterID, err := keys.ClusterID(key.MeasurementSecret, salt)
	if err != nil {
		return err
	}
	// Before the lock: join services admit only nodes whose PCR 15 is zero.
	if err := checkGeneration(bootCtx, c, joins, meta, uuid, clusterID, key); err != nil {
		return err
	}
	if _, err := nodelock.New(tpmdev.Open, mlog).TryLock(clusterID); err != nil {
		return err
	}
	c.log("state", "node locked to cluster %x (PCR %d); mounted on %s/var", clusterID[:8], nodelock.PCR, sysroot)
	if err := checkKept(c, key); err != nil {
		return err
	}
	if err := recordClusterVersion(c, key); err != nil {
		return err
	}
	recordOwner(c, key)
	if err := lease.Down(); err != nil {
		c.log("network", "could not take the network down for the OS: %v", err)
	}
	return nil
}

// checkKept checks what the node keeps on its state disk that decides
// what its OS runs (keptfiles), with what the join service's ticket or
// the owner's recovery says of the cluster and of the node's role. The
// metadata service's role, the host's word, counts for nothing here.
func checkKept(c *console, key unlock.Key) error {
	t := time.Now()
	cl := key.Cluster
	if cl == nil {
		return errors.New("the disk key came without the cluster's word on this node's role and cluster, so nothing its disk keeps can be trusted: the OS does not start; " +
			"rejoin through a join service or recover with the orrery built with this image")
	}
	facts := keptfiles.Facts{ControlPlane: cl.ControlPlane, CACert: cl.CACert, Endpoint: cl.Endpoint}
	kept := &keptfiles.Checker{Root: sysroot, Say: func(format string, args ...any) { c.log("kept", format, args...) }}
	if err := kept.Check(facts); err != nil {
		return fmt.Errorf("%w. Root on this node changed it since the node wrote it, so the OS does not start: "+
			"remove the node from the cluster ('orrery node remove NAME --yes') and create a new one in its place", err)
	}
	role := "worker"
	if facts.ControlPlane {
		role = "control plane"
	}
	c.log("kept", "kubeadm's and kubelet's kept files are a %s's (%s)", role, since(t))
	return nil
}

// recordClusterVersion leaves the cluster's Kubernetes version, as the
// join service's ticket said it, for bootstrapperd to run that release
// (handoff.ClusterVersionFile, on /run). A recovery says none: the
// recovered control plane runs what its checked static pods name.
func recordClusterVersion(c *console, key unlock.Key) error {
	v := key.Cluster.KubernetesVersion
	if v == "" {
		return nil
	}
	if err := handoff.WriteClusterVersion(handoff.ClusterVersionFile, v); err != nil {
		return err
	}
	c.log("kept", "the cluster runs Kubernetes %s: the node runs that release of its image", v)
	return nil
}

// recordOwner writes the owner's access key that came with the disk key
// over the node's copy, which the inspect service reads: root on the node
// may have changed that copy, and the change must not outlive the boot.
func recordOwner(c *console, key unlock.Key) {
	if len(key.OwnerAccessKey) == 0 {
		c.log("owner", "the disk key came without the owner's access key (a join service older than it): the node keeps its copy")
		return
	}
	if err := owneraccess.Write(filepath.Join(sysroot, owneraccess.Path), key.OwnerAccessKey); err != nil {
		c.log("owner", "could not record the owner's access key for the inspect service: %v", err)
	}
}

// awaitKey waits until the disk is open (opened is closed), or the
// rejoin ends without opening it (rejoined). The rejoin ends that way on
// a disk the Unlocker refused (unlock.ErrRefused), whether a round or a
// recovery found it: no key is tried on it again in this boot, so the
// boot fails rather than wait for ever with its recovery server up.
func awaitKey(opened <-chan struct{}, rejoined <-chan error) error {
	select {
	case <-opened:
		return nil
	case err := <-rejoined:
		select {
		case <-opened:
			return nil
		default:
		}
		if err == nil {
			return errors.New("the rejoin ended without opening the state disk")
		}
		if errors.Is(err, unlock.ErrRefused) {
			return refused(err)
		}
		return fmt.Errorf("rejoin: %w", err)
	}
}

// refused adds to an error of the Unlocker what to do about a refused
// disk (unlock.ErrRefused); other errors it returns as they are.
func refused(err error) error {
	if !errors.Is(err, unlock.ErrRefused) {
		return err
	}
	return fmt.Errorf("%w. No key is tried on it in this boot: whoever controls the node's disks changed it. "+
		"Replace it with a blank disk (serial %q) to join the node as a new node", err, handoff.Serial)
}

// networkUp gets a DHCP lease, trying until it does: without a network
// neither the join service nor the owner can reach the node.
func networkUp(ctx context.Context, c *console) netup.Lease {
	for attempt := 1; ; attempt++ {
		t := time.Now()
		lease, err := netup.Up(ctx, dhcpTimeout)
		if err == nil {
			c.log("network", "%s (DHCP in %s)", lease, since(t))
			return lease
		}
		c.log("network", "no DHCP lease yet (attempt %d): %v; retrying", attempt, err)
		time.Sleep(5 * time.Second)
	}
}

func joinServiceDialer(issuer *vtpm.Issuer, platform nodeattest.Platform) (*joinconn.Dialer, error) {
	cas, err := qemu.OwnPlatformCAs(tpmdev.Open)
	if err != nil {
		return nil, fmt.Errorf("read the platform CA that certified this node's attestation key: %w", err)
	}
	// The join service must show the hardware evidence of this node's
	// own kind: on an SEV-SNP or TDX node, never a vTPM alone.
	peer, err := platform.PeerPolicy()
	if err != nil {
		return nil, fmt.Errorf("join service dialer: %w", err)
	}
	return joinconn.New(joinconn.Config{Issuer: issuer, OpenTPM: tpmdev.Open, PlatformCAs: cas, Peer: peer})
}

// detectPlatform asks until it knows which attestation the platform
// offers (the metadata service may not answer at once after DHCP).
func detectPlatform(ctx context.Context, c *console, meta *metadata.Client) (nodeattest.Platform, error) {
	p, err := nodeattest.DetectUntil(ctx, meta, func(_ int, err error) {
		c.log("attest", "cannot tell which attestation this platform offers yet: %v; retrying", err)
	})
	if err == nil {
		c.log("attest", "attesting as %s%s", p.Variant, map[bool]string{true: " (simulated by the local cloud: a test root, not a real CPU)"}[p.Simulated])
	}
	return p, err
}

// headerOwner reads the owner's access key from the state disk's LUKS2
// header, where bootstrapperd recorded it; nil if there is none. The
// header is the host's to rewrite: the key only decides who may read the
// initrd's own log and status, which its console shows the host anyway.
func headerOwner(ctx context.Context, c *console, tool *cryptsetup.Tool, dev string) ed25519.PublicKey {
	field, err := tool.Subsystem(ctx, dev)
	if err == nil {
		var owner ed25519.PublicKey
		if owner, err = owneraccess.FromHeaderField(field); err == nil {
			return owner
		}
	}
	c.log("owner", "no owner's access key in the state disk's header (%v): while it waits, the node shows its log to no one but its console", err)
	return nil
}

// serveWhileWaiting serves, on port 9001 while the node waits for its
// disk key, RecoverService on a control plane (once the metadata service
// says this node is one) and, if the owner is known, the inspect service
// with the initrd's status and log. The returned function stops the
// server, letting a call in flight answer first.
func serveWhileWaiting(ctx context.Context, c *console, meta *metadata.Client, issuer *vtpm.Issuer, uuid string, u *unlock.Unlocker, owner ed25519.PublicKey) (stop func()) {
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		self, err := selfWhenKnown(ctx, c, meta)
		recovery := err == nil && self.Role == role.ControlPlane
		if err != nil || !recovery && owner == nil {
			return
		}
		// The handshake takes any client: recovery's is whoever holds the
		// master secret, and the inspect service checks the owner's key on
		// every call.
		creds, err := atls.NewCredentials(atls.Config{Issuer: issuer})
		if err != nil {
			c.log("recover", "cannot serve recovery: %v", err)
			return
		}
		// A Recover request is two 32-byte fields and the cluster's CA
		// certificate (about 1 KiB), a inspect service one a few small ones.
		srv := grpc.NewServer(grpc.Creds(creds), grpc.MaxRecvMsgSize(4096))
		if recovery {
			recoverpb.RegisterRecoverServiceServer(srv, &unlock.RecoverServer{
				DiskUUID: uuid, Unlocker: u, Say: func(format string, args ...any) { c.log("recover", format, args...) },
			})
		}
		if owner != nil {
			if err := registerInspectService(srv, c, owner); err != nil {
				c.log("owner", "cannot serve the owner: %v", err)
			}
		}
		lis, err := (&net.ListenConfig{}).Listen(ctx, "tcp", ":"+strconv.Itoa(recoverpb.Port))
		if err != nil {
			c.log("recover", "cannot serve recovery: %v", err)
			return
		}
		if recovery {
			c.log("recover", "serving recovery on port %d: if no join service answers (every control plane down), run 'orrery recover --node %s' with the cluster's master secret", recoverpb.Port, self.IP)
		}
		if owner != nil {
			c.log("owner", "serving this log and the node's status to its owner on port %d ('orrery logs %s')", recoverpb.Port, self.Name)
		}
		go func() {
			<-ctx.Done()
			stopped := make(chan struct{})
			go func() { srv.GracefulStop(); close(stopped) }()
			select {
			case <-stopped:
			case <-time.After(5 * time.Second):
				srv.Stop()
			}
		}()
		if err := srv.Serve(lis); err != nil && !errors.Is(err, grpc.ErrServerStopped) {
			c.log("recover", "recovery server: %v", err)
		}
	}()
	return func() {
		cancel()
		<-done
	}
}

// registerInspectService adds the inspect service of the initrd: its status
// and its own log, for the owner alone.
func registerInspectService(srv *grpc.Server, c *console, owner ed25519.PublicKey) error {
	svc, err := inspectserver.New(inspectserver.Config{
		Owner:   func() (ed25519.PublicKey, error) { return owner, nil },
		Journal: &c.kept,
		Status:  inspectserver.Host{Stage: "initrd"}.Status,
		Log:     slog.New(slog.NewTextHandler(logWriter{c}, nil)),
	})
	if err != nil {
		return err
	}
	inspectpb.RegisterInspectServiceServer(srv, svc)
	return nil
}

// logWriter turns the inspect service's log records into console lines.
type logWriter struct{ c *console }

func (w logWriter) Write(p []byte) (int, error) {
	w.c.log("owner", "%s", strings.TrimSpace(string(p)))
	return len(p), nil
}

// selfWhenKnown asks the metadata service who this node is until it
// answers or ctx ends.
func selfWhenKnown(ctx context.Context, c *console, meta *metadata.Client) (metadata.Instance, error) {
	for attempt := 1; ; attempt++ {
		self, err := meta.Self(ctx)
		if err == nil {
			return self, nil
		}
		if attempt == 1 || attempt%10 == 0 {
			c.log("recover", "metadata service: %v; retrying", err)
		}
		select {
		case <-ctx.Done():
			return metadata.Instance{}, ctx.Err()
		case <-time.After(3 * time.Second):
		}
	}
}
