package kubeupgrade

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/orrery-dev/orrery/internal/etcd"
)

// NodeClient is a node's upgrade service, reached and verified.
type NodeClient interface {
	// Upgrade has the node run kubeadm's upgrade to version (apply:
	// kubeadm upgrade apply) and switch its kubelet, handing each line of
	// its output to line.
	Upgrade(ctx context.Context, version string, apply bool, line func(string)) error
	// BackupEtcd writes a snapshot of the node's etcd member to w.
	BackupEtcd(ctx context.Context, w io.Writer) error
	Close() error
}

// Config is what an upgrade works with.
type Config struct {
	Client kubernetes.Interface
	// Connect reaches a node's upgrade service.
	Connect func(ctx context.Context, n Node) (NodeClient, error)
	// Say reports progress, a line at a time.
	Say func(format string, args ...any)
	// NodeTimeout bounds one node's upgrade (kubeadm's and kubelet's);
	// DrainTimeout a worker's drain; ReadyTimeout the wait for a node's
	// Node to report the new kubelet as Ready.
	NodeTimeout, DrainTimeout, ReadyTimeout time.Duration
}

// NodeError is a node whose upgrade failed; the nodes after it were not
// touched.
type NodeError struct {
	Node string
	// From is the release the node ran before.
	From string
	// MayRun means the node's upgrade may be running still: the owner
	// lost it (a cut connection, NodeTimeout) before the node said how
	// it ended.
	MayRun bool
	Err    error
}

func (e *NodeError) Error() string {
	if e.MayRun {
		return fmt.Sprintf("the upgrade of node %s may still be running there (%v): it stays cordoned until an upgrade run sees it end", e.Node, e.Err)
	}
	return fmt.Sprintf("node %s was not upgraded from %s: %v", e.Node, e.From, e.Err)
}

func (e *NodeError) Unwrap() error { return e.Err }

// lostError is a node's upgrade that the owner lost track of.
type lostError struct{ err error }

func (e lostError) Error() string { return e.err.Error() }
func (e lostError) Unwrap() error { return e.err }

// settled tells whether err, a node's answer to an upgrade, means the
// node is done with it: it refused the request before any change, or ran
// it, failed and went back (Aborted). Any other error (a cut connection,
// a deadline, the node busy) leaves open whether kubeadm runs there
// still.
func settled(err error) bool {
	switch status.Code(err) {
	case codes.Aborted, codes.FailedPrecondition, codes.InvalidArgument, codes.PermissionDenied, codes.Unauthenticated:
		return true
	}
	return false
}

// Run runs the plan's pending steps in order, and stops at the first
// that fails (a *NodeError).
func Run(ctx context.Context, c Config, p Plan) error {
	for _, st := range p.Steps {
		n := st.Node
		if st.Done {
			c.Say("%s: runs Kubernetes %s already", n.Name, p.To)
			continue
		}
		started := time.Now()
		role := "worker"
		if n.ControlPlane {
			role = "control plane"
		}
		c.Say("%s (%s): upgrading from %s to %s", n.Name, role, n.Kubelet, p.To)
		if err := c.upgradeNode(ctx, st, p.To); err != nil {
			var lost lostError
			return &NodeError{Node: n.Name, From: n.Kubelet, MayRun: errors.As(err, &lost), Err: err}
		}
		c.Say("%s: runs Kubernetes %s, upgraded in %s", n.Name, p.To, time.Since(started).Round(time.Second))
	}
	return nil
}

func (c Config) upgradeNode(ctx context.Context, st Step, to string) (err error) {
	n := st.Node
	if !n.ControlPlane {
		if err := cordon(ctx, c.Client, n, to); err != nil {
			return err
		}
		// A node left on its old release still serves: it is uncordoned
		// whether or not its upgrade went through. One whose upgrade the
		// owner interrupted or lost may be upgrading still: it stays
		// cordoned, with the mark that has the next run finish it and
		// uncordon it.
		defer func() {
			var lost lostError
			if ctx.Err() != nil || errors.As(err, &lost) {
				return
			}
			if uerr := uncordon(ctx, c.Client, n.Name); uerr != nil {
				err = errors.Join(err, uerr)
			}
		}()
		t := time.Now()
		if err := drainNode(ctx, c.Client, n.Name, c.DrainTimeout, c.Say); err != nil {
			return err
		}
		c.Say("  drained %s in %s", n.Name, time.Since(t).Round(time.Second))
	}
	return c.upgradeOn(ctx, st, to)
}

// upgradeOn has node st run its kubeadm upgrade, and waits until it
// reports the new kubelet.
func (c Config) upgradeOn(ctx context.Context, st Step, to string) error {
	ctx, cancel := context.WithTimeout(ctx, c.NodeTimeout)
	defer cancel()
	nc, err := c.Connect(ctx, st.Node)
	if err != nil {
		return err
	}
	defer nc.Close()
	// Each line of kubeadm's output with the time since the node's upgrade
	// began: kubeadm's own lines carry none, and its steps differ in
	// length by minutes.
	began := time.Now()
	say := func(l string) { c.Say("  %5s | %s", elapsed(time.Since(began)), l) }
	if err := nc.Upgrade(ctx, to, st.Apply, say); err != nil {
		if !settled(err) {
			return lostError{err}
		}
		return err
	}
	c.Say("  the node's upgrade took %s; waiting for its Node to report kubelet %s, Ready", time.Since(began).Round(time.Second), to)
	waited := time.Now()
	if err := c.waitNode(ctx, st.Node.Name, to); err != nil {
		return err
	}
	c.Say("  its Node reported it after %s", time.Since(waited).Round(time.Second))
	return nil
}

// elapsed is d as minutes and seconds, "3:07".
func elapsed(d time.Duration) string {
	sec := int(d.Round(time.Second) / time.Second)
	return fmt.Sprintf("%d:%02d", sec/60, sec%60)
}

// waitNode waits until the Node of name reports kubelet at version and
// Ready.
func (c Config) waitNode(ctx context.Context, name, version string) error {
	ctx, cancel := context.WithTimeout(ctx, c.ReadyTimeout)
	defer cancel()
	var last string
	for {
		node, err := c.Client.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
		if err == nil {
			n := readNode(*node, nil)
			if n.Kubelet == version && n.Ready {
				return nil
			}
			last = fmt.Sprintf("its Node reports kubelet %s, Ready %t", n.Kubelet, n.Ready)
		} else {
			last = err.Error()
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("kubeadm's upgrade went through, but within %s %s", c.ReadyTimeout, last)
		case <-time.After(2 * time.Second):
		}
	}
}

// BackupEtcd saves a snapshot of the etcd member of control plane n to
// path (0600: it holds every Secret of the cluster), checked against the
// hash etcd ends it with. A snapshot that fails leaves no file.
func BackupEtcd(ctx context.Context, c Config, n Node, path string) (size int64, err error) {
	nc, err := c.Connect(ctx, n)
	if err != nil {
		return 0, err
	}
	defer nc.Close()
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return 0, fmt.Errorf("create the backup folder: %w", err)
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return 0, fmt.Errorf("create the etcd backup: %w", err)
	}
	defer func() {
		if cerr := f.Close(); err == nil && cerr != nil {
			err = fmt.Errorf("write the etcd backup: %w", cerr)
		}
		if err != nil {
			_ = os.Remove(path)
		}
	}()
	w := etcd.NewWriter(f)
	if err := nc.BackupEtcd(ctx, w); err != nil {
		return 0, fmt.Errorf("back up etcd from %s: %w", n.Name, err)
	}
	if err := w.Check(); err != nil {
		return 0, fmt.Errorf("back up etcd from %s: %w", n.Name, err)
	}
	if err := f.Sync(); err != nil {
		return 0, fmt.Errorf("write the etcd backup: %w", err)
	}
	return w.Size(), nil
}
