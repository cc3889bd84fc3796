package kubeupgrade

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"golang.org/x/sync/errgroup"
	"k8s.io/client-go/kubernetes"
)

// ServingCAFile is where a control plane's API server finds the
// kubelet-serving CA, the one CA it checks kubelets against once moved.
const ServingCAFile = "/etc/kubernetes/pki/kubelet-serving-ca.crt"

// ToMove lists the control planes whose API server checks kubelets against
// another CA than the kubelet-serving CA: those of a cluster made before
// it, or of a move cut short.
func (s State) ToMove() []Node {
	var out []Node
	for _, n := range s.Nodes {
		if n.ControlPlane && n.KubeletCA != ServingCAFile {
			out = append(out, n)
		}
	}
	return out
}

// ServingCAClient is a node's upgrade service, for a move to the
// kubelet-serving CA.
type ServingCAClient interface {
	// MoveKubeletServingCA moves a control plane to the pair, and
	// returns the static pods it wrote anew.
	MoveKubeletServingCA(ctx context.Context, certPEM, keyPEM []byte) ([]string, error)
	// RenewKubeletServingCertificate has the node's kubelet ask for a
	// new serving certificate.
	RenewKubeletServingCertificate(ctx context.Context) error
	Close() error
}

// MoveConfig is what a move to the kubelet-serving CA works with.
type MoveConfig struct {
	Client  kubernetes.Interface
	Connect func(ctx context.Context, n Node) (ServingCAClient, error)
	// Pair is the kubelet-serving CA's pair, the same on every call.
	Pair func() (certPEM, keyPEM []byte, err error)
	Say  func(format string, args ...any)
	// NodeTimeout bounds one control plane's move and one node's
	// renewal; ServeWait how long a renewed kubelet may take until the
	// API server reaches it.
	NodeTimeout, ServeWait time.Duration
}

// renewAtOnce is how many kubelets renew at once: each restarts, and a
// busy host's control plane answers their requests one after another.
const renewAtOnce = 4

// MoveServingCA moves the cluster in state s to the kubelet-serving CA:
// each control plane on another one moves (its API server then checks
// kubelets against that CA alone, and its controller manager signs their
// serving certificates with it), then each kubelet that the API server
// cannot reach through its serving certificate asks for a new one. From a
// control plane's move until a kubelet's new certificate, 'kubectl logs',
// 'exec' and 'port-forward' to that node fail through that control plane;
// the wait is said. Run again after an interruption, it goes on where it
// stopped.
func MoveServingCA(ctx context.Context, c MoveConfig, s State) error {
	started := time.Now()
	if move := s.ToMove(); len(move) > 0 {
		certPEM, keyPEM, err := c.Pair()
		if err != nil {
			return err
		}
		for _, n := range move {
			if err := c.moveControlPlane(ctx, n, certPEM, keyPEM); err != nil {
				return fmt.Errorf("control plane %s did not move to the kubelet-serving CA: %w", n.Name, err)
			}
		}
	}
	var stale []Node
	for _, n := range s.Nodes {
		if err := KubeletReached(ctx, c.Client, n.Name); err != nil {
			stale = append(stale, n)
		}
	}
	if len(stale) == 0 {
		return nil
	}
	renewing := time.Now()
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(renewAtOnce)
	for _, n := range stale {
		g.Go(func() error {
			if err := c.renew(gctx, n, renewing); err != nil {
				return fmt.Errorf("node %s: %w", n.Name, err)
			}
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		return err
	}
	c.Say("  the API server reaches every kubelet with its new serving certificate, %s after the move began", time.Since(started).Round(time.Second))
	return nil
}

func (c MoveConfig) moveControlPlane(ctx context.Context, n Node, certPEM, keyPEM []byte) error {
	ctx, cancel := context.WithTimeout(ctx, c.NodeTimeout)
	defer cancel()
	nc, err := c.Connect(ctx, n)
	if err != nil {
		return err
	}
	defer nc.Close()
	c.Say("%s (control plane): moving to the kubelet-serving CA: its API server and controller manager restart", n.Name)
	t := time.Now()
	rewrote, err := nc.MoveKubeletServingCA(ctx, certPEM, keyPEM)
	if err != nil {
		return err
	}
	what := "it ran with the CA already"
	if len(rewrote) > 0 {
		what = "wrote " + strings.Join(rewrote, ", ") + " anew"
	}
	c.Say("  %s moved in %s (%s)", n.Name, time.Since(t).Round(time.Second), what)
	return nil
}

// renew has node n's kubelet ask for a new serving certificate, and waits
// until the API server reaches it.
func (c MoveConfig) renew(ctx context.Context, n Node, since time.Time) error {
	rctx, cancel := context.WithTimeout(ctx, c.NodeTimeout)
	defer cancel()
	nc, err := c.Connect(rctx, n)
	if err != nil {
		return err
	}
	defer nc.Close()
	if err := nc.RenewKubeletServingCertificate(rctx); err != nil {
		return fmt.Errorf("renew kubelet's serving certificate: %w", err)
	}
	wctx, cancel := context.WithTimeout(ctx, c.ServeWait)
	defer cancel()
	for {
		err := KubeletReached(wctx, c.Client, n.Name)
		if err == nil {
			c.Say("  %s: kubelet serves a certificate of the kubelet-serving CA (logs and exec back after %s)", n.Name, time.Since(since).Round(time.Second))
			return nil
		}
		select {
		case <-wctx.Done():
			return fmt.Errorf("the API server does not reach its kubelet %s after the renewal: %w; 'orrery logs %s kubelet' and 'kubectl get csr' say why", c.ServeWait, err, n.Name)
		case <-time.After(2 * time.Second):
		}
	}
}

// KubeletReached asks node name's kubelet for its health through the API
// server, which connects to it as for 'kubectl logs' and 'exec', checking
// its serving certificate.
func KubeletReached(ctx context.Context, client kubernetes.Interface, name string) error {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	body, err := client.CoreV1().RESTClient().Get().AbsPath("/api/v1/nodes", name, "proxy", "healthz").DoRaw(ctx)
	if err != nil {
		return err
	}
	if strings.TrimSpace(string(body)) != "ok" {
		return errors.New("kubelet answered its health check with " + strings.TrimSpace(string(body)))
	}
	return nil
}
