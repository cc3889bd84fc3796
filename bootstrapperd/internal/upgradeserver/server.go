// Package upgradeserver is a node's side of the Kubernetes upgrade
// protocol (kubeupgradepb): it runs kubeadm's upgrade to a release the
// node's image carries, switches the node's kubelet to it, and streams a
// control plane's etcd snapshot to the owner.
//
// Whoever reaches it has proved the owner's access key (ownerservice);
// what it checks itself is what the node alone knows: the releases its
// image carries, the one it runs, whether it is a control plane. So a
// request the owner's orrery should never send (a downgrade, a skipped
// minor, a release the image lacks, kubeadm's cluster-wide apply on a
// worker) is refused here too.
package upgradeserver

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"k8s.io/client-go/kubernetes"

	"github.com/orrery-dev/orrery/bootstrapperd/internal/kubeadm"
	"github.com/orrery-dev/orrery/bootstrapperd/internal/kuberelease"
	"github.com/orrery-dev/orrery/internal/etcd"
	"github.com/orrery-dev/orrery/internal/proto/kubeupgradepb"
	"github.com/orrery-dev/orrery/internal/versions"
)

// Kubelet is the node's kubelet service.
type Kubelet interface {
	// Restart restarts kubelet, which then runs the release the node's
	// link points at.
	Restart(ctx context.Context, out io.Writer) error
	// Healthy returns nil once kubelet answers its health check.
	Healthy(ctx context.Context) error
}

// Etcd is the node's etcd member (etcd.Member): its snapshot, and the
// cluster's membership as it sees it.
type Etcd interface {
	Stream(ctx context.Context, send func(data []byte, remaining uint64) error) error
	Members(ctx context.Context) ([]etcd.MemberInfo, error)
	Health(ctx context.Context, members []etcd.MemberInfo) map[uint64]etcd.Health
	Status(ctx context.Context) (etcd.Status, error)
	Remove(ctx context.Context, id uint64) ([]etcd.MemberInfo, error)
}

// Config is what the server works on.
type Config struct {
	Release kuberelease.Node
	// Kubeadm runs kubeadm; its Runner also runs what Kubelet does not.
	Kubeadm *kubeadm.Tool
	// Manifests is where kubelet reads a control plane's static pods;
	// KubeletConfig is kubelet's kubeconfig, there once the node joined
	// a cluster.
	Manifests, KubeletConfig string
	// KubeadmBackups is where kubeadm upgrade leaves a copy of the
	// static pods and of etcd's data it replaced (/etc/kubernetes/tmp).
	// It is removed once the upgrade ended, however it did: the owner's
	// etcd snapshot is the backup, and the state disk should not hold a
	// second copy of every Secret (the boot's check of kept files would
	// remove it anyway).
	KubeadmBackups string
	Kubelet        Kubelet
	Etcd           Etcd
	// PKIDir is kubeadm's certificate directory (kubeadm.CertificatesDir),
	// KubeletPKI kubelet's (/var/lib/kubelet/pki).
	PKIDir, KubeletPKI string
	// Cluster is a client of the cluster with the node's admin
	// kubeconfig, for a control plane's move to the kubelet-serving CA.
	Cluster func() (kubernetes.Interface, error)
	// PodWait is how long a rewritten static pod may take to run again.
	PodWait time.Duration
	// KubeletWait is how long a switched kubelet may take to answer its
	// health check before the node goes back to the release it ran.
	KubeletWait time.Duration
	Log         *slog.Logger
}

// jobTimeout bounds an upgrade that hangs: kubeadm waits up to 15 min
// for each control-plane component it replaces (kubeadm.UpgradeConfig)
// and kubelet up to KubeletWait; an upgrade still running after an hour
// is stuck, and is killed rather than keep the node busy for ever.
const jobTimeout = time.Hour

// Server implements kubeupgradepb.KubernetesUpgradeServiceServer.
type Server struct {
	kubeupgradepb.UnimplementedKubernetesUpgradeServiceServer
	c Config

	mu  sync.Mutex
	job *job
	// changing names a change other than an upgrade that runs (a move
	// to the kubelet-serving CA), which an upgrade waits for.
	changing string
	// jobs counts the upgrades that run: Wait waits for them.
	jobs sync.WaitGroup
	// removing is held while an etcd member is removed.
	removing sync.Mutex
}

// New returns a server. An upgrade it starts runs to its end, whoever
// follows it and whatever stops the service: kubeadm killed halfway leaves
// a control plane with some components on either release, and kubelet
// killed between its release link and its restart leaves the node on
// neither. Kubeadm's and kubelet's waits bound it.
func New(c Config) *Server {
	return &Server{c: c}
}

// Wait waits until no upgrade runs: the service calls it before it exits,
// and systemd gives it TimeoutStopSec to.
func (s *Server) Wait() { s.jobs.Wait() }

// Busy says which upgrade runs, if one does.
func (s *Server) Busy() (version string, running bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.job == nil || !s.job.running() {
		return "", false
	}
	return s.job.version, true
}

// Releases implements kubeupgradepb.KubernetesUpgradeServiceServer.
func (s *Server) Releases(context.Context, *kubeupgradepb.ReleasesRequest) (*kubeupgradepb.ReleasesResponse, error) {
	running, err := s.c.Release.Active()
	if err != nil && !errors.Is(err, kuberelease.ErrNone) {
		return nil, status.Error(codes.Internal, err.Error())
	}
	return &kubeupgradepb.ReleasesResponse{Carried: versions.List(), Running: running, ControlPlane: s.controlPlane()}, nil
}

func (s *Server) controlPlane() bool {
	_, err := os.Stat(filepath.Join(s.c.Manifests, "kube-apiserver.yaml"))
	return err == nil
}

// Upgrade implements kubeupgradepb.KubernetesUpgradeServiceServer.
func (s *Server) Upgrade(req *kubeupgradepb.UpgradeRequest, stream kubeupgradepb.KubernetesUpgradeService_UpgradeServer) error {
	j, err := s.start(req)
	if err != nil {
		return err
	}
	var sendErr error
	err = j.follow(stream.Context(), func(lines []string) error {
		sendErr = stream.Send(&kubeupgradepb.UpgradeOutput{Lines: lines})
		return sendErr
	})
	switch {
	case err == nil:
		return nil
	case stream.Context().Err() != nil || sendErr != nil:
		// The follower went; the upgrade goes on.
		return status.Errorf(codes.Canceled, "the upgrade to Kubernetes %s goes on on this node: %v", j.version, err)
	}
	// Aborted: the upgrade ended and failed, and the node is back on its
	// release (the error says which).
	return status.Error(codes.Aborted, err.Error())
}

// check refuses what this node must not run, before anything changes;
// it returns the release the node runs. The caller holds s.mu, so that
// no upgrade ends between the check and the start of the next (one that
// did would make a request of the release it ran from a downgrade).
func (s *Server) check(req *kubeupgradepb.UpgradeRequest) (string, error) {
	v := req.GetKubernetesVersion()
	if err := versions.Supported(v); err != nil {
		return "", status.Errorf(codes.InvalidArgument, "this node's image does not carry Kubernetes %q: %v", v, err)
	}
	if req.GetStep() != kubeupgradepb.Step_STEP_APPLY && req.GetStep() != kubeupgradepb.Step_STEP_NODE {
		return "", status.Errorf(codes.InvalidArgument, "unknown upgrade step %v", req.GetStep())
	}
	if _, err := os.Stat(s.c.KubeletConfig); err != nil {
		return "", status.Errorf(codes.FailedPrecondition, "this node is part of no cluster yet (%v): there is nothing to upgrade", err)
	}
	if req.GetStep() == kubeupgradepb.Step_STEP_APPLY && !s.controlPlane() {
		return "", status.Error(codes.FailedPrecondition, "this node is no control plane: kubeadm upgrade apply runs on a control plane")
	}
	from, err := s.c.Release.Active()
	if err != nil {
		return "", status.Errorf(codes.FailedPrecondition, "this node runs no Kubernetes release to upgrade from: %v", err)
	}
	if err := versions.CheckUpgrade(from, v); err != nil {
		return "", status.Errorf(codes.FailedPrecondition, "this node runs Kubernetes %s: %v", from, err)
	}
	return from, nil
}

// start starts req's upgrade, or returns the same upgrade if it runs
// already (a client that lost its connection asks again).
func (s *Server) start(req *kubeupgradepb.UpgradeRequest) (*job, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.job != nil && s.job.running() {
		if s.job.version == req.GetKubernetesVersion() && s.job.step == req.GetStep() {
			return s.job, nil
		}
	}
	if err := s.busyLocked(); err != nil {
		return nil, err
	}
	from, err := s.check(req)
	if err != nil {
		return nil, err
	}
	j := newJob(req.GetKubernetesVersion(), req.GetStep(), func(line string) { s.c.Log.Info("upgrade", "output", line) })
	s.job = j
	s.jobs.Add(1)
	go func() {
		defer s.jobs.Done()
		start := time.Now()
		s.c.Log.Info("upgrading Kubernetes", "from", from, "to", j.version, "step", stepName(j.step))
		ctx, cancel := context.WithTimeout(context.Background(), jobTimeout)
		defer cancel()
		err := s.run(ctx, j, from)
		if err != nil {
			s.c.Log.Error("upgrade failed", "to", j.version, "error", err.Error(), "took", time.Since(start).Round(time.Second).String())
		} else {
			s.c.Log.Info("upgraded Kubernetes", "to", j.version, "took", time.Since(start).Round(time.Second).String())
		}
		j.finish(err)
	}()
	return j, nil
}

func stepName(s kubeupgradepb.Step) string {
	if s == kubeupgradepb.Step_STEP_APPLY {
		return "kubeadm upgrade apply"
	}
	return "kubeadm upgrade node"
}

// run runs kubeadm's upgrade, then switches kubelet.
func (s *Server) run(ctx context.Context, j *job, from string) error {
	dir, err := kuberelease.Folder(j.version)
	if err != nil {
		return err
	}
	p := kubeadm.UpgradeParams{
		KubernetesVersion: j.version, Kubeadm: filepath.Join(s.c.Release.Root, dir, "kubeadm"),
		Apply: j.step == kubeupgradepb.Step_STEP_APPLY, ControlPlane: s.controlPlane(),
	}
	if p.Apply {
		if p.Endpoint, err = s.c.Kubeadm.Endpoint(); err != nil {
			return err
		}
	}
	// Once kubeadm is done with them, its backups go whatever the
	// outcome: kubeadm puts a failed control plane back from them itself,
	// and the owner's etcd snapshot is the backup that outlives the run.
	defer s.removeKubeadmBackups(j)
	started := time.Now()
	fmt.Fprintf(j, "[orrery-upgrade] %s to Kubernetes %s (this node runs %s)\n", stepName(j.step), j.version, from)
	if err := s.c.Kubeadm.Upgrade(ctx, p, j); err != nil {
		return fmt.Errorf("%s to %s failed; this node still runs %s (kubeadm puts back a control plane's static pods that do not come up): %w", stepName(j.step), j.version, from, err)
	}
	fmt.Fprintf(j, "[orrery-upgrade] %s took %s\n", stepName(j.step), time.Since(started).Round(time.Second))
	return s.switchKubelet(ctx, from, j.version, j)
}

func (s *Server) removeKubeadmBackups(out io.Writer) {
	if s.c.KubeadmBackups == "" {
		return
	}
	if err := os.RemoveAll(s.c.KubeadmBackups); err != nil {
		fmt.Fprintf(out, "[orrery-upgrade] could not remove kubeadm's backups in %s: %v\n", s.c.KubeadmBackups, err)
	}
}

// switchKubelet points the node at release to and restarts kubelet; a
// kubelet that does not come back healthy is switched back to from.
func (s *Server) switchKubelet(ctx context.Context, from, to string, out io.Writer) error {
	started := time.Now()
	fmt.Fprintf(out, "[orrery-kubelet] restarting kubelet on Kubernetes %s\n", to)
	if err := s.c.Release.Activate(to); err != nil {
		return err
	}
	err := s.c.Kubelet.Restart(ctx, out)
	if err == nil {
		err = s.waitHealthy(ctx)
	}
	if err == nil {
		fmt.Fprintf(out, "[orrery-kubelet] kubelet of Kubernetes %s is healthy after %s\n", to, time.Since(started).Round(time.Second))
		return nil
	}
	fmt.Fprintf(out, "[orrery-kubelet] kubelet of Kubernetes %s did not come up (%v); going back to %s\n", to, err, from)
	if rerr := s.c.Release.Activate(from); rerr != nil {
		return fmt.Errorf("kubelet of Kubernetes %s did not come up (%w), and going back to %s failed: %w", to, err, from, rerr)
	}
	if rerr := s.c.Kubelet.Restart(ctx, out); rerr != nil {
		return fmt.Errorf("kubelet of Kubernetes %s did not come up (%w), and restarting kubelet of %s failed: %w", to, err, from, rerr)
	}
	return fmt.Errorf("kubelet of Kubernetes %s did not come up: %w; this node's kubelet runs %s again", to, err, from)
}

func (s *Server) waitHealthy(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, s.c.KubeletWait)
	defer cancel()
	var last error
	for {
		if last = s.c.Kubelet.Healthy(ctx); last == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("not healthy after %s: %w", s.c.KubeletWait, last)
		case <-time.After(time.Second):
		}
	}
}

// BackupEtcd implements kubeupgradepb.KubernetesUpgradeServiceServer.
// The snapshot holds every Secret of the cluster: it goes to the owner
// alone (ownerservice), and nowhere on the node.
func (s *Server) BackupEtcd(_ *kubeupgradepb.BackupEtcdRequest, stream kubeupgradepb.KubernetesUpgradeService_BackupEtcdServer) error {
	if !s.controlPlane() {
		return status.Error(codes.FailedPrecondition, "this node is no control plane: it runs no etcd member")
	}
	started := time.Now()
	var n int
	err := s.c.Etcd.Stream(stream.Context(), func(data []byte, remaining uint64) error {
		n += len(data)
		return stream.Send(&kubeupgradepb.BackupChunk{Data: data, RemainingBytes: remaining})
	})
	if err != nil {
		return status.Error(codes.Unavailable, strings.TrimSpace(err.Error()))
	}
	s.c.Log.Info("sent the owner a snapshot of etcd", "bytes", n, "took", time.Since(started).Round(time.Millisecond).String())
	return nil
}
