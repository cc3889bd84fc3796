package cmd

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"net/netip"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/client-go/kubernetes"

	"github.com/orrery-dev/orrery/internal/attestation/qemu/platformca"
	"github.com/orrery-dev/orrery/internal/cloud"
	"github.com/orrery-dev/orrery/internal/keys"
	"github.com/orrery-dev/orrery/internal/owner/dialer"
	"github.com/orrery-dev/orrery/internal/owner/inspect"
	"github.com/orrery-dev/orrery/internal/owner/nodeaddr"
	"github.com/orrery-dev/orrery/internal/owner/workspace"
	"github.com/orrery-dev/orrery/internal/proto/inspectpb"
)

// clusterOptions are the flags of the commands that read running nodes:
// what proves the owner to a node, what a node must prove, and where the
// nodes are.
type clusterOptions struct {
	masterSecretPath string
	kc               kubeconfigOptions
	measurements     []string
	hardware         hardwareOptions
	platformCAPath   string
	miniDir          string
	trustAnyAK       bool
	timeout          time.Duration
	// ws is the workspace, from the root's --workspace (set by owner).
	ws workspace.Dir
}

func addClusterFlags(f *pflag.FlagSet, o *clusterOptions, timeout time.Duration) {
	f.StringVar(&o.masterSecretPath, "master-secret", "", "the cluster's master secret, as 'orrery init' wrote it (the state file beside it is read too): the owner's access key is derived from it (default: "+workspace.MasterSecretFile+" in the workspace)")
	addKubeconfigFlags(f, &o.kc)
	f.StringArrayVar(&o.measurements, "measurements", nil, measurementsUsage+"; repeatable: during an upgrade, the nodes may run either image")
	addHardwareFlags(f, &o.hardware)
	f.StringVar(&o.platformCAPath, "platform-ca", "", "CA certificate that certifies the nodes' attestation keys (default: the one of 'orrery mini')")
	f.StringVar(&o.miniDir, "mini-dir", "orrery-mini", "state directory of 'orrery mini': supplies the default --platform-ca, and the nodes' addresses when the API server does not answer")
	f.BoolVar(&o.trustAnyAK, "insecure-trust-any-ak", false, "accept any attestation key (development only: a software TPM can then impersonate a node)")
	f.DurationVar(&o.timeout, "timeout", timeout, "how long to wait for each node")
}

// check checks the flags and the nodes named on their own, before any
// file is read or node dialled.
func (o clusterOptions) check(names []string) error {
	var errs []error
	if o.timeout <= 0 {
		errs = append(errs, fmt.Errorf("--timeout %s: want a positive duration such as 1m", o.timeout))
	}
	for _, n := range names {
		_, isAddr, err := asAddress(n)
		switch {
		case err != nil:
			errs = append(errs, err)
		case !isAddr && len(validation.IsDNS1123Subdomain(n)) > 0:
			errs = append(errs, fmt.Errorf("%q is neither a node's name (as 'kubectl get nodes' lists it) nor its address (IP, HOST:PORT or [IPv6]:PORT)", n))
		}
	}
	return errors.Join(errs...)
}

// owner reads what the owner holds: the access key and cluster ID from the
// master secret and the state file, the accepted images, the platform CA.
// names are the nodes the command was given, checked first.
func (o *clusterOptions) owner(cmd *cobra.Command, names []string) (inspect.Owner, error) {
	if err := o.check(names); err != nil {
		return inspect.Owner{}, err
	}
	o.ws = workspaceDir(cmd)
	if o.masterSecretPath == "" {
		o.masterSecretPath = o.ws.Path(workspace.MasterSecretFile)
	}
	ms, err := keys.ReadMasterSecretFile(o.masterSecretPath)
	if err != nil {
		err = fmt.Errorf("read the master secret (pass --master-secret, or --workspace: the directory where 'orrery init' wrote %s): %w", workspace.MasterSecretFile, err)
		if errors.Is(err, fs.ErrNotExist) {
			err = noMasterSecret{err}
		}
		return inspect.Owner{}, err
	}
	st, err := workspace.Dir(filepath.Dir(o.masterSecretPath)).ReadState()
	if err != nil {
		return inspect.Owner{}, fmt.Errorf("read %s beside the master secret: %w", workspace.StateFile, err)
	}
	key, err := ms.OwnerAccessKey()
	if err != nil {
		return inspect.Owner{}, err
	}
	msec, err := ms.MeasurementSecret()
	if err != nil {
		return inspect.Owner{}, err
	}
	clusterID, err := keys.ClusterID(msec, st.MeasurementSalt)
	if err != nil {
		return inspect.Owner{}, err
	}
	images, err := o.images()
	if err != nil {
		return inspect.Owner{}, err
	}
	cas, err := o.platformCAs()
	if err != nil {
		return inspect.Owner{}, err
	}
	return inspect.Owner{
		Key: key, ClusterID: clusterID, Images: images, PlatformCAs: cas,
		Collateral: o.hardware.collateral(), TrustAnyAK: o.trustAnyAK, Logger: logger(cmd),
	}, nil
}

// images reads the measurements files the owner named, or the image 'make
// image' built (its SEV-SNP measurements for a cloud of 'orrery mini up
// --sev-snp', whose test root the owner names).
func (o clusterOptions) images() ([]inspect.Image, error) {
	paths, err := withMiniDefaults(o.measurements, o.hardware, o.miniDir)
	if err != nil {
		return nil, err
	}
	var images []inspect.Image
	for _, p := range paths {
		pol, err := loadPolicy(p, o.hardware)
		if errors.Is(err, fs.ErrNotExist) {
			return nil, fmt.Errorf("%w: pass the image's measurements with --measurements, or build the image with 'make image'", err)
		}
		if err != nil {
			return nil, err
		}
		images = append(images, inspect.Image{Name: p, Policy: pol})
	}
	return images, nil
}

// platformCAs is the CA the owner named, or 'orrery mini”s; none with
// --insecure-trust-any-ak.
func (o clusterOptions) platformCAs() ([]*x509.Certificate, error) {
	if o.trustAnyAK {
		return nil, nil
	}
	ca, err := o.platformCA()
	if err != nil {
		return nil, err
	}
	return []*x509.Certificate{ca}, nil
}

func (o clusterOptions) platformCA() (*x509.Certificate, error) {
	path := o.platformCAPath
	if path == "" {
		if _, err := cloud.ReadState(o.miniDir); errors.Is(err, fs.ErrNotExist) {
			return nil, errors.New("no --platform-ca given and no 'orrery mini' state in " + o.miniDir + ": pass the platform CA certificate with --platform-ca, or --insecure-trust-any-ak for development")
		} else if err != nil {
			return nil, fmt.Errorf("no --platform-ca given, and the local cloud's CA is not taken: %w", err)
		}
		path = filepath.Join(o.miniDir, cloud.PlatformCACert)
	}
	return platformca.LoadCert(path)
}

// target is a node to reach: its name if known, and the inspect service's
// address.
type target struct {
	Name string `json:"name,omitempty"`
	Addr string `json:"address"`
}

// label names t in messages.
func (t target) label() string {
	if t.Name != "" {
		return t.Name
	}
	return t.Addr
}

// targets resolves the nodes the owner named: an address stands for
// itself; a name is looked up among the cluster's nodes. No names means
// every node. The cluster's nodes come from the API server, or, when it
// does not answer, from 'orrery mini”s state, which the command says on
// stderr.
func (o clusterOptions) targets(ctx context.Context, stderr io.Writer, names []string) ([]target, error) {
	var out, known []target
	var listErr error
	listed := false
	list := func() {
		if !listed {
			known, listErr = o.clusterNodes(ctx, stderr)
			listed = true
		}
	}
	if len(names) == 0 {
		list()
		if listErr != nil {
			return nil, listErr
		}
		return known, nil
	}
	for _, n := range names {
		addr, ok, err := asAddress(n)
		if err != nil {
			return nil, err
		}
		if ok {
			out = append(out, target{Addr: addr})
			continue
		}
		list()
		if listErr != nil {
			return nil, fmt.Errorf("find node %q: %w", n, listErr)
		}
		i := slices.IndexFunc(known, func(t target) bool { return t.Name == n })
		if i < 0 {
			return nil, fmt.Errorf("the cluster has no node %q; it has %s", n, nodeNames(known))
		}
		out = append(out, known[i])
	}
	return out, nil
}

func nodeNames(ts []target) string {
	var n []string
	for _, t := range ts {
		n = append(n, t.Name)
	}
	if len(n) == 0 {
		return "none"
	}
	return strings.Join(n, ", ")
}

// asAddress reads s as the inspect service's address if it is one (an IP
// address, [IPv6], HOST:PORT or a URL, which is refused); anything else is
// a node's name.
func asAddress(s string) (addr string, ok bool, err error) {
	_, _, splitErr := net.SplitHostPort(s)
	_, ipErr := netip.ParseAddr(s)
	if ipErr != nil && splitErr != nil && !strings.Contains(s, "://") && !strings.HasPrefix(s, "[") {
		return "", false, nil
	}
	addr, err = dialer.ParseAddress(s, inspectpb.Port)
	return addr, true, err
}

// apiServerWait is how long the API server may take to list the nodes
// before the command falls back: an owner who inspects a broken cluster
// should not wait for client-go's retries.
const apiServerWait = 10 * time.Second

func (o clusterOptions) clusterNodes(ctx context.Context, stderr io.Writer) ([]target, error) {
	ts, apiErr := o.apiServerNodes(ctx)
	if apiErr == nil {
		return ts, nil
	}
	st, err := cloud.ReadState(o.miniDir)
	if err != nil {
		return nil, fmt.Errorf("the API server did not list the nodes (%v), and there is no 'orrery mini' state in %s: name the nodes by address", apiErr, o.miniDir)
	}
	fmt.Fprintf(stderr, "The API server did not list the nodes (%v); using the nodes of 'orrery mini' in %s.\n", apiErr, o.miniDir)
	for _, n := range st.Nodes {
		if !n.Spare {
			ts = append(ts, target{Name: n.Name, Addr: netip.AddrPortFrom(n.IP, inspectpb.Port).String()})
		}
	}
	return ts, nil
}

func (o clusterOptions) apiServerNodes(ctx context.Context) ([]target, error) {
	rc, err := o.kc.restConfig(o.ws)
	if err != nil {
		return nil, err
	}
	rc.Timeout = apiServerWait
	client, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, apiServerWait)
	defer cancel()
	list, err := client.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, err
	}
	var ts []target
	for _, n := range list.Items {
		ip := nodeaddr.InternalIP(n)
		if ip == "" {
			continue
		}
		addr, err := dialer.ParseAddress(ip, inspectpb.Port)
		if err != nil {
			return nil, fmt.Errorf("the API server lists node %s at an address that is not one: %w", n.Name, err)
		}
		ts = append(ts, target{Name: n.Name, Addr: addr})
	}
	slices.SortFunc(ts, func(a, b target) int { return strings.Compare(a.Name, b.Name) })
	return ts, nil
}

// dialNode reaches one node, verified, within the command's timeout. A
// node named by the owner must prove that it is that node: its address
// is only what its Node object or the local cloud's state says.
func (o clusterOptions) dialNode(ctx context.Context, owner inspect.Owner, t target) (*inspect.Node, error) {
	ctx, cancel := context.WithTimeout(ctx, o.timeout)
	defer cancel()
	n, err := owner.Dial(ctx, t.Addr, t.Name)
	if err != nil {
		if errors.Is(ctx.Err(), context.DeadlineExceeded) {
			// Not a refusal: the node may still be starting its
			// socket-activated node service (slow on a VM short of CPU).
			return nil, fmt.Errorf("%s did not answer within %s: run the command again, or pass a longer --timeout (%w)", t.label(), o.timeout, err)
		}
		return nil, fmt.Errorf("%s: %w", t.label(), err)
	}
	return n, nil
}

// errNoMasterSecret is what owner returns, wrapped, when there is no
// master secret at all: a command that only shows more to the owner
// leaves that part out, where any other error is reported.
var errNoMasterSecret = errors.New("no master secret")

type noMasterSecret struct{ error }

func (e noMasterSecret) Is(target error) bool { return target == errNoMasterSecret }
func (e noMasterSecret) Unwrap() error        { return e.error }
