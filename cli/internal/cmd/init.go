package cmd

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"maps"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"

	"github.com/orrery-dev/orrery/cli/internal/charts"
	"github.com/orrery-dev/orrery/cli/internal/toolout"
	"github.com/orrery-dev/orrery/internal/atls"
	"github.com/orrery-dev/orrery/internal/attestation"
	"github.com/orrery-dev/orrery/internal/attestation/measurements"
	"github.com/orrery-dev/orrery/internal/attestation/qemu"
	"github.com/orrery-dev/orrery/internal/attestation/qemu/platformca"
	"github.com/orrery-dev/orrery/internal/attestation/variant"
	"github.com/orrery-dev/orrery/internal/cloud"
	"github.com/orrery-dev/orrery/internal/keys"
	"github.com/orrery-dev/orrery/internal/nodelock"
	"github.com/orrery-dev/orrery/internal/proto/initpb"
)

// Files `orrery init` writes in its output directory.
const (
	MasterSecretFile = "orrery-master-secret.json"
	StateFile        = "orrery-state.json"
	KubeconfigFile   = "orrery-admin.conf"
	JournalFile      = "orrery-init-failure.log"
	KubeadmLogFile   = "orrery-init-kubeadm.log"
)

type initOptions struct {
	miniDir           string
	node              string
	measurementsPath  string
	platformCAPath    string
	initSecretPath    string
	outDir            string
	kubernetesVersion string
	clusterName       string
	sans              []string
	serviceCIDR       string
	timeout           time.Duration
	verbose           bool
	skipServices      bool
}

func newInitCmd() *cobra.Command {
	var o initOptions
	c := &cobra.Command{
		Use:   "init",
		Short: "Initialise a cluster on a node that has attested itself",
		Long: `init connects to the first control-plane node over attested TLS, checks its
measurements, and sends it the cluster's master secret (generated and saved
to orrery-master-secret.json, mode 0600, unless that file exists) with the
cluster's settings. The node locks itself to the new cluster, re-keys its
state disk, runs kubeadm init and returns the admin kubeconfig, which init
writes to orrery-admin.conf.

Keep orrery-master-secret.json safe: it is the only way to recover the
cluster's disks.`,
		Example: `  # a cluster on 'orrery mini': node, platform CA and init secret come from ./orrery-mini
  orrery init --measurements build/image/measurements.json

  # an explicit node
  orrery init --node 10.42.1.100 --measurements build/image/measurements.json \
    --platform-ca orrery-mini/platform-ca.crt --init-secret-file orrery-mini/init-secret`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return runInit(cmd.Context(), cmd.OutOrStdout(), cmd.ErrOrStderr(), o)
		},
	}
	f := c.Flags()
	f.StringVar(&o.miniDir, "mini-dir", "orrery-mini", "state directory of 'orrery mini'; supplies defaults for --node, --platform-ca and --init-secret-file")
	f.StringVar(&o.node, "node", "", "first control-plane node, HOST or HOST:PORT (default: the first control plane of 'orrery mini')")
	f.StringVar(&o.measurementsPath, "measurements", "build/image/measurements.json", "the image's expected measurements")
	f.StringVar(&o.platformCAPath, "platform-ca", "", "CA certificate that certifies the nodes' attestation keys")
	f.StringVar(&o.initSecretPath, "init-secret-file", "", "file holding the init secret created with the VM")
	f.StringVar(&o.outDir, "out-dir", ".", "where to write the master secret, kubeconfig and state files")
	f.StringVar(&o.kubernetesVersion, "kubernetes-version", "v1.36.3", "Kubernetes version to install")
	f.StringVar(&o.clusterName, "cluster-name", "orrery", "cluster name (a DNS label)")
	f.StringSliceVar(&o.sans, "api-server-san", nil, "extra name or IP for the API server certificate (repeatable)")
	f.StringVar(&o.serviceCIDR, "service-cidr", "10.96.0.0/12", "IP range of Kubernetes services")
	f.DurationVar(&o.timeout, "timeout", 30*time.Minute, "how long to wait for the node and for kubeadm")
	f.BoolVar(&o.verbose, "verbose", false, "show kubeadm's output")
	f.BoolVar(&o.skipServices, "skip-services", false, "do not install the cluster services (tests of the init protocol)")
	_ = f.MarkHidden("skip-services")
	return c
}

// initState is what the owner keeps about a cluster besides its secrets.
type initState struct {
	Node            string `json:"node"`
	ClusterName     string `json:"clusterName"`
	MeasurementSalt []byte `json:"measurementSalt"`
	ClusterID       []byte `json:"clusterID,omitempty"`
}

func (o *initOptions) applyMiniDefaults() error {
	st, err := cloud.ReadState(o.miniDir)
	if errors.Is(err, fs.ErrNotExist) {
		if o.node == "" {
			return errors.New("no --node given and no 'orrery mini' state in " + o.miniDir + ": pass --node")
		}
		return nil
	}
	if err != nil {
		return err
	}
	if o.node == "" {
		for _, n := range st.Nodes {
			if n.Role == cloud.ControlPlane {
				o.node = n.IP.String()
				break
			}
		}
	}
	if o.platformCAPath == "" {
		o.platformCAPath = filepath.Join(o.miniDir, cloud.PlatformCACert)
	}
	if o.initSecretPath == "" {
		o.initSecretPath = filepath.Join(o.miniDir, cloud.InitSecretFile)
	}
	return nil
}

func runInit(ctx context.Context, out, errOut io.Writer, o initOptions) error {
	if err := o.applyMiniDefaults(); err != nil {
		return err
	}
	if o.platformCAPath == "" {
		return errors.New("no --platform-ca given: pass the CA that certifies the nodes' attestation keys")
	}
	if o.initSecretPath == "" {
		return errors.New("no --init-secret-file given: pass the file with the init secret created with the VM")
	}
	m, err := measurements.Load(o.measurementsPath)
	if err != nil {
		return fmt.Errorf("load measurements: %w (build the image with 'make image')", err)
	}
	ca, err := platformca.LoadCert(o.platformCAPath)
	if err != nil {
		return err
	}
	initSecret, err := os.ReadFile(o.initSecretPath)
	if err != nil {
		return fmt.Errorf("read init secret: %w", err)
	}
	initSecret = []byte(strings.TrimSpace(string(initSecret)))

	if err := os.MkdirAll(o.outDir, 0o700); err != nil {
		return err
	}
	ms, created, err := loadOrCreateMasterSecret(filepath.Join(o.outDir, MasterSecretFile))
	if err != nil {
		return err
	}
	if created {
		fmt.Fprintf(out, "Generated the master secret: %s (keep it safe: it recovers the cluster's disks)\n", filepath.Join(o.outDir, MasterSecretFile))
	}
	addr := o.node
	if _, _, err := net.SplitHostPort(addr); err != nil {
		addr = net.JoinHostPort(addr, DefaultNodePort)
	}
	// A retry must send the same measurement salt, or the node derives
	// another cluster ID and refuses.
	st, newState, err := loadOrCreateState(filepath.Join(o.outDir, StateFile), addr, o.clusterName)
	if err != nil {
		return err
	}

	log := slog.New(slog.NewTextHandler(errOut, &slog.HandlerOptions{Level: slog.LevelWarn}))
	v, err := initValidator(m, ca, log, ms, st.MeasurementSalt, !created && !newState)
	if err != nil {
		return err
	}
	creds, err := atls.NewCredentials(atls.Config{Validators: []attestation.Validator{v}})
	if err != nil {
		return err
	}
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(creds))
	if err != nil {
		return fmt.Errorf("connect to %s: %w", addr, err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(ctx, o.timeout)
	defer cancel()

	req := &initpb.InitRequest{
		MasterSecret:      ms.Key,
		MasterSecretSalt:  ms.Salt,
		MeasurementSalt:   st.MeasurementSalt,
		KubernetesVersion: o.kubernetesVersion,
		InitSecret:        initSecret,
		ClusterName:       o.clusterName,
		ApiServerCertSans: o.sans,
		ServiceCidr:       o.serviceCIDR,
	}
	fmt.Fprintf(out, "Initialising the cluster %q on %s\n", o.clusterName, addr)
	start := time.Now()
	if err := waitForNode(ctx, out, addr, creds); err != nil {
		return err
	}
	var stream initpb.InitService_InitClient
	for attempt := 1; ; attempt++ {
		stream, err = initpb.NewInitServiceClient(conn).Init(ctx, req)
		if err == nil {
			break
		}
		if status.Code(err) != codes.Unavailable || attempt == 5 || ctx.Err() != nil {
			return fmt.Errorf("init: %w", err)
		}
		time.Sleep(2 * time.Second)
	}
	var steps toolout.Timeline
	step := func(name string) {
		steps.Begin(name, time.Now())
		fmt.Fprintf(out, "  [%6.1fs] %s\n", time.Since(start).Seconds(), name)
	}
	kubeadmOut := &toolout.Follower{OnPhase: func(phase string) {
		if !strings.HasPrefix(phase, "orrery-") { // the node's own steps around kubeadm
			phase = "kubeadm " + phase
		}
		step(phase)
	}}
	for {
		resp, err := stream.Recv()
		if err == io.EOF {
			return errors.New("init: the node closed the stream without a result")
		}
		if err != nil {
			st := status.Convert(err)
			switch st.Code() {
			case codes.Unavailable, codes.Canceled, codes.DeadlineExceeded, codes.Unknown, codes.Internal:
				return fmt.Errorf("init on %s: %s (%s); if the connection dropped, run the same command again: the node returns its result", addr, st.Message(), st.Code())
			}
			// The node refused the request as it stands: retrying the
			// same command cannot help.
			return fmt.Errorf("init on %s: %s (%s)", addr, st.Message(), st.Code())
		}
		switch k := resp.GetKind().(type) {
		case *initpb.InitResponse_Progress:
			step(k.Progress.GetMessage())
		case *initpb.InitResponse_Log:
			kubeadmOut.Write(k.Log.GetData())
			if o.verbose {
				out.Write(k.Log.GetData())
			}
		case *initpb.InitResponse_Failed:
			return initFailed(o.outDir, k.Failed, kubeadmOut)
		case *initpb.InitResponse_Done:
			kubeconfig := filepath.Join(o.outDir, KubeconfigFile)
			if err := os.WriteFile(kubeconfig, k.Done.GetKubeconfig(), 0o600); err != nil {
				return fmt.Errorf("write kubeconfig: %w", err)
			}
			st.ClusterID = k.Done.GetClusterId()
			if err := writeJSON(filepath.Join(o.outDir, StateFile), st); err != nil {
				return err
			}
			fmt.Fprintf(out, "The cluster is initialised (%s). Cluster ID: %x\n", time.Since(start).Round(time.Second), st.ClusterID)
			if !o.skipServices {
				step("installing the cluster services (pod network, join service, key service)")
				if err := installServices(ctx, out, kubeconfig, o.serviceReleases(addr), 15*time.Minute); err != nil {
					return fmt.Errorf("%w\nthe cluster runs; run the same 'orrery init' again to retry installing its services", err)
				}
				step("checking that the control plane is healthy and stays so")
				if err := waitSteady(ctx, out, kubeconfig, steadyTimeout); err != nil {
					host, _, _ := net.SplitHostPort(addr)
					return fmt.Errorf("%w\nthe control-plane node's journal tells why: kubectl --kubeconfig %s get --raw '/api/v1/nodes/NODE/proxy/logs/?query=kubelet' "+
						"(the API server at %s must answer; 'kubectl get events -A' too); "+
						"run the same 'orrery init' again to check again", err, kubeconfig, host)
				}
			}
			fmt.Fprintln(out, "Time per step:")
			toolout.WriteSteps(out, steps.Steps(time.Now()))
			fmt.Fprintf(out, "Done in %s. Kubeconfig: %s\n", time.Since(start).Round(time.Second), kubeconfig)
			return nil
		}
	}
}

// initFailed saves what the node sent about its failure (its journal)
// and kubeadm's output, and returns an error with the end of the output,
// where kubeadm says what went wrong.
func initFailed(outDir string, f *initpb.InitFailure, kubeadmOut *toolout.Follower) error {
	save := func(name string, data []byte) string {
		path := filepath.Join(outDir, name)
		if err := os.WriteFile(path, data, 0o600); err != nil {
			return "(could not save it: " + err.Error() + ")"
		}
		return path
	}
	msg := "init failed on the node: " + f.GetErrorMessage()
	if len(kubeadmOut.Output()) > 0 {
		msg += "\nthe end of kubeadm's output:\n" + indent(kubeadmOut.Tail(15), "    ") +
			"\nall of it is in " + save(KubeadmLogFile, kubeadmOut.Output())
	}
	return errors.New(msg + "\nthe node's journal is in " + save(JournalFile, f.GetJournal()))
}

func indent(s, prefix string) string {
	return prefix + strings.ReplaceAll(s, "\n", "\n"+prefix)
}

// podCIDR is the pod network; kubeadm's podSubnet on the node matches it.
const podCIDR = "10.244.0.0/16"

func (o initOptions) serviceReleases(nodeAddr string) []serviceRelease {
	host, _, _ := net.SplitHostPort(nodeAddr)
	meas, _ := os.ReadFile(o.measurementsPath)
	ca, _ := os.ReadFile(o.platformCAPath)
	return []serviceRelease{
		{name: "flannel", chart: charts.Flannel, values: map[string]any{
			"podCIDR":   podCIDR,
			"apiServer": map[string]any{"host": host, "port": kubeAPIPort},
		}},
		{name: "orrery-services", chart: charts.OrreryServices, values: map[string]any{
			"endpoint":          net.JoinHostPort(host, kubeAPIPort),
			"kubernetesVersion": o.kubernetesVersion,
			"measurements":      string(meas),
			"platformCA":        string(ca),
		}},
	}
}

func loadOrCreateMasterSecret(path string) (keys.MasterSecret, bool, error) {
	ms, err := keys.ReadMasterSecretFile(path)
	if err == nil {
		return ms, false, nil
	}
	if !errors.Is(err, fs.ErrNotExist) {
		return ms, false, err
	}
	ms, err = keys.GenerateMasterSecret(rand.Reader)
	if err != nil {
		return ms, false, err
	}
	return ms, true, keys.WriteMasterSecretFile(path, ms)
}

// loadOrCreateState reads the owner's state file, or creates it with a
// fresh measurement salt; created says which.
func loadOrCreateState(path, node, clusterName string) (st initState, created bool, err error) {
	raw, err := os.ReadFile(path)
	if err == nil {
		if err := json.Unmarshal(raw, &st); err != nil || len(st.MeasurementSalt) != keys.SaltSize {
			return st, false, fmt.Errorf("%s is damaged: restore it from a backup (it holds the cluster's measurement salt)", path)
		}
		return st, false, nil
	}
	if !errors.Is(err, fs.ErrNotExist) {
		return st, false, err
	}
	salt, err := keys.GenerateSalt(rand.Reader)
	if err != nil {
		return st, false, err
	}
	st = initState{Node: node, ClusterName: clusterName, MeasurementSalt: salt}
	return st, true, writeJSON(path, st)
}

// initValidator checks the node's attestation for an init. A node that
// belongs to no cluster shows PCR 15 as zero, as the measurements say.
// Once an init has taken the node lock, PCR 15 holds the lock's value for
// that init's cluster ID, and no reboot-free way leads back to zero. So a
// retry of this owner's own init (retry: the master secret and the
// measurement salt both come from an earlier run) also accepts PCR 15
// locked to exactly the cluster ID they derive, which only a holder of
// both could have caused. Every other PCR is checked as before, and no
// other value of PCR 15 passes: a node locked to someone else's cluster
// is refused.
func initValidator(m measurements.M, ca *x509.Certificate, log *slog.Logger, ms keys.MasterSecret, measurementSalt []byte, retry bool) (attestation.Validator, error) {
	fresh, err := qemu.NewValidator(qemu.ValidatorConfig{Measurements: m, PlatformCAs: []*x509.Certificate{ca}, Logger: log})
	if err != nil {
		return nil, err
	}
	want, ok := m[nodelock.PCR]
	if !retry || !ok {
		return fresh, nil
	}
	msec, err := ms.MeasurementSecret()
	if err != nil {
		return nil, err
	}
	clusterID, err := keys.ClusterID(msec, measurementSalt)
	if err != nil {
		return nil, err
	}
	lockedM := maps.Clone(m)
	lockedM[nodelock.PCR] = measurements.Measurement{Expected: nodelock.Expected(clusterID), WarnOnly: want.WarnOnly}
	locked, err := qemu.NewValidator(qemu.ValidatorConfig{Measurements: lockedM, PlatformCAs: []*x509.Certificate{ca}, Logger: log})
	if err != nil {
		return nil, err
	}
	return freshOrLocked{fresh: fresh, locked: locked}, nil
}

// freshOrLocked accepts a node that fresh accepts, or else one that
// locked accepts: the two differ only in PCR 15.
type freshOrLocked struct{ fresh, locked attestation.Validator }

func (v freshOrLocked) Variant() variant.Variant { return v.fresh.Variant() }

func (v freshOrLocked) Validate(ctx context.Context, doc, nonce []byte) ([]byte, error) {
	userData, err := v.fresh.Validate(ctx, doc, nonce)
	if err == nil {
		return userData, nil
	}
	var mismatch *measurements.MismatchError
	if !errors.As(err, &mismatch) {
		return nil, err
	}
	userData, lockedErr := v.locked.Validate(ctx, doc, nonce)
	if lockedErr == nil {
		return userData, nil
	}
	return nil, fmt.Errorf("%w; nor does it show the node lock of this cluster's own earlier init: %v", err, lockedErr)
}

func writeJSON(path string, v any) error {
	raw, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, append(raw, '\n'), 0o600); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	return os.Rename(tmp, path)
}

// kubeAPIPort is the API server's port on nodes (a variable for tests).
var kubeAPIPort = "6443"

// kubeAPIAnswers reports whether a TLS server listens on the Kubernetes
// API port of the node at addr. It is a hint for an error message, not
// trust: the certificate is not checked and nothing is sent.
func kubeAPIAnswers(ctx context.Context, addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	d := tls.Dialer{Config: &tls.Config{InsecureSkipVerify: true}} //nolint:gosec // presence check only
	conn, err := d.DialContext(ctx, "tcp", net.JoinHostPort(host, kubeAPIPort))
	if err != nil {
		return false
	}
	conn.Close()
	return true
}

// waitForNode waits until the node at addr accepts connections and then
// checks its attestation once. A node that is not up yet is waited for; a
// node whose attestation is rejected fails at once, since waiting cannot
// change what it runs.
func waitForNode(ctx context.Context, out io.Writer, addr string, creds credentials.TransportCredentials) error {
	var d net.Dialer
	for attempt := 1; ; attempt++ {
		conn, err := d.DialContext(ctx, "tcp", addr)
		if err == nil {
			hctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
			var tlsConn net.Conn
			tlsConn, _, err = creds.Clone().ClientHandshake(hctx, addr, conn)
			cancel()
			if err == nil {
				tlsConn.Close()
				return nil
			}
			conn.Close()
			var rejected *atls.RejectedError
			if errors.As(err, &rejected) {
				return fmt.Errorf("the node at %s is not running the expected image: %w", addr, rejected.Err)
			}
		} else if errors.Is(err, syscall.ECONNREFUSED) && kubeAPIAnswers(ctx, addr) {
			// bootstrapperd stops for good once its node belongs to a
			// cluster, so a refused port alone looks like a node still
			// booting; an API server beside it tells the two apart.
			return fmt.Errorf("the node at %s already belongs to a cluster: its Kubernetes API server answers and its bootstrapper has stopped. "+
				"Use the kubeconfig of the init that set it up; to start another cluster, create new VMs ('orrery mini down', then 'orrery mini up')", addr)
		}
		if ctx.Err() != nil {
			return fmt.Errorf("the node at %s did not answer in time: %v", addr, err)
		}
		if attempt == 1 || attempt%10 == 0 {
			fmt.Fprintf(out, "  waiting for %s: %v\n", addr, err)
		}
		select {
		case <-ctx.Done():
		case <-time.After(2 * time.Second):
		}
	}
}
