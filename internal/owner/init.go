package owner

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	"github.com/orrery-dev/orrery/internal/atls"
	"github.com/orrery-dev/orrery/internal/attestation"
	"github.com/orrery-dev/orrery/internal/attestation/measurements"
	"github.com/orrery-dev/orrery/internal/attestation/policy"
	"github.com/orrery-dev/orrery/internal/attestation/validator"
	"github.com/orrery-dev/orrery/internal/clusternet"
	"github.com/orrery-dev/orrery/internal/nodelock"
	"github.com/orrery-dev/orrery/internal/owner/dialer"
	"github.com/orrery-dev/orrery/internal/owner/services"
	"github.com/orrery-dev/orrery/internal/owner/toolout"
	"github.com/orrery-dev/orrery/internal/owner/workspace"
	"github.com/orrery-dev/orrery/internal/proto/initpb"
	"github.com/orrery-dev/orrery/internal/records/admitted"
	"github.com/orrery-dev/orrery/internal/records/measurementset"
	"github.com/orrery-dev/orrery/internal/termtext"
)

// InitConfig is what Init needs: the node, what it must prove, and the
// cluster's settings. The context passed to Init bounds the whole flow.
type InitConfig struct {
	// Node is bootstrapperd's attested-TLS address on the first control
	// plane, HOST:PORT.
	Node string
	// Measurements are what the node must show: the image's PCRs and,
	// for a hardware variant, its section (package policy).
	Measurements policy.Policy
	// PlatformCA certifies the nodes' attestation keys.
	PlatformCA *x509.Certificate
	// Collateral is the owner's cache of AMD's and Intel's collateral,
	// for the hardware variants.
	Collateral validator.Collateral
	// InitSecret is the secret the VM was created with; only its holder
	// may initialise the node.
	InitSecret []byte
	// Workspace is where the owner's files go: the master secret, the
	// state, the kubeconfig. Init refuses one that holds another init's.
	Workspace workspace.Dir
	// ReplaceWorkspace sets another init's files in Workspace aside,
	// once the node has attested, instead of refusing.
	ReplaceWorkspace  bool
	KubernetesVersion string
	ClusterName       string
	APIServerSANs     []string
	ServiceCIDR       string
	// Endpoint is the control planes' stable address, HOST:PORT: a load
	// balancer in front of every control plane's API server and join
	// service. Empty means the node's own API server, and a cluster that
	// is reached through it alone.
	Endpoint string
	// SkipServices stops after kubeadm init: no cluster services, no
	// health check (tests of the init protocol).
	SkipServices bool
	// APIServerPort is the Kubernetes API's port on the node; zero
	// means clusternet.APIServerPort.
	APIServerPort int
	// Logger receives the validator's warnings; nil discards them.
	Logger   *slog.Logger
	Progress Progress
}

// InitResult is a cluster that Init set up.
type InitResult struct {
	ClusterID []byte
	// Kubeconfig is the path of the admin kubeconfig in the workspace.
	Kubeconfig string
}

// Timeouts of Init's last steps, within the context's deadline.
const (
	servicesTimeout = 15 * time.Minute
	steadyTimeout   = 10 * time.Minute
)

// Init initialises a cluster on the node of cfg: it waits for the node,
// checks its attestation, sends it the master secret and the cluster's
// settings, follows kubeadm init, and then installs the cluster services
// and waits until the control plane is steady. Run again after a failure,
// it sends the same secrets (from the workspace), so the node that an
// interrupted run locked to this cluster is accepted and finishes.
func Init(ctx context.Context, cfg InitConfig) (InitResult, error) {
	r := newReporter(cfg.Progress)
	if cfg.APIServerPort == 0 {
		cfg.APIServerPort = clusternet.APIServerPort
	}
	plan, err := cfg.Workspace.PlanInit(cfg.Node, cfg.ClusterName, cfg.ReplaceWorkspace)
	if err != nil {
		return InitResult{}, err
	}
	if plan.Stage == workspace.InitDone {
		if !clusterGone(ctx, cfg.Node, cfg.APIServerPort) {
			return cfg.finishServices(ctx, plan.State, r)
		}
		st := plan.State
		if !cfg.ReplaceWorkspace {
			return InitResult{}, fmt.Errorf("the workspace records the cluster %q (ID %x) as initialised on %s, but the node there runs no Kubernetes API server "+
				"and waits to be initialised: it is a new VM, not that cluster's node. "+
				"To initialise it, run 'orrery init --replace-workspace' (the old cluster's files are set aside, not deleted)", st.ClusterName, st.ClusterID, st.Node)
		}
		r.notice(fmt.Sprintf("The workspace's cluster %q (ID %x) no longer runs on %s: its node waits to be initialised. Its files will be set aside", st.ClusterName, st.ClusterID, st.Node))
		if plan, err = cfg.Workspace.PlanReplacement(cfg.Node, cfg.ClusterName); err != nil {
			return InitResult{}, err
		}
	}
	ms, state := plan.MasterSecret, plan.State
	// A resumed init must send the same secrets and measurement salt, or
	// the node derives another cluster ID and refuses.
	v, err := initValidator(validator.Config{Policy: cfg.Measurements, PlatformCAs: []*x509.Certificate{cfg.PlatformCA}, Collateral: cfg.Collateral, Logger: orDiscard(cfg.Logger)}, ms, state.MeasurementSalt, plan.Stage == workspace.InitInterrupted)
	if err != nil {
		return InitResult{}, err
	}
	d, err := dialer.New(v)
	if err != nil {
		return InitResult{}, err
	}
	r.notice(fmt.Sprintf("Initialising the cluster %q on %s", cfg.ClusterName, cfg.Node))
	start := time.Now()
	if err := d.WaitAttested(ctx, cfg.Node, cfg.onNodeAbsent(ctx, r)); err != nil {
		return InitResult{}, lockedElsewhere(cfg.Node, err)
	}
	// Only a node that attested gets a workspace written for it.
	kept, err := plan.Keep()
	if err != nil {
		return InitResult{}, err
	}
	if kept.SetAside != "" {
		r.notice(fmt.Sprintf("Moved the earlier init's files to %s", kept.SetAside))
	}
	if kept.Wrote {
		r.notice(fmt.Sprintf("Generated the master secret: %s (keep it safe: it recovers the cluster's disks)", cfg.Workspace.Path(workspace.MasterSecretFile)))
	}
	req := &initpb.InitRequest{
		MasterSecret:      ms.Key,
		MasterSecretSalt:  ms.Salt,
		MeasurementSalt:   state.MeasurementSalt,
		KubernetesVersion: cfg.KubernetesVersion,
		InitSecret:        cfg.InitSecret,
		ClusterName:       cfg.ClusterName,
		ApiServerCertSans: cfg.APIServerSANs,
		ServiceCidr:       cfg.ServiceCIDR,

		ControlPlaneEndpoint: cfg.Endpoint,
	}
	done, node, err := runInit(ctx, d, cfg, req, r)
	if err != nil {
		return InitResult{}, err
	}
	if _, err := cfg.Workspace.WriteKubeconfig(done.GetKubeconfig()); err != nil {
		return InitResult{}, err
	}
	state.ClusterID = done.GetClusterId()
	state.FirstNode = &workspace.FirstNode{Name: node.Name, InstanceID: node.ID, DiskUUID: done.GetStateDiskUuid()}
	if err := cfg.Workspace.WriteState(state); err != nil {
		return InitResult{}, err
	}
	r.notice(fmt.Sprintf("The cluster is initialised (%s). Cluster ID: %x", time.Since(start).Round(time.Second), state.ClusterID))
	return cfg.installServices(ctx, state, r)
}

// finishServices is an init run again after kubeadm init finished: the
// node's bootstrapper has stopped, so what is left is the cluster
// services and the health check, through the kubeconfig.
func (cfg InitConfig) finishServices(ctx context.Context, st workspace.State, r *reporter) (InitResult, error) {
	r.notice(fmt.Sprintf("The cluster %q (ID %x) was initialised on %s by an earlier run; finishing its services", st.ClusterName, st.ClusterID, st.Node))
	return cfg.installServices(ctx, st, r)
}

// installServices installs the services of the cluster st records, and
// records its first node as admitted, through the workspace's kubeconfig.
func (cfg InitConfig) installServices(ctx context.Context, st workspace.State, r *reporter) (InitResult, error) {
	kubeconfig := cfg.Workspace.Path(workspace.KubeconfigFile)
	res := InitResult{ClusterID: st.ClusterID, Kubeconfig: kubeconfig}
	if cfg.SkipServices {
		return res, nil
	}
	var node firstNode
	if f := st.FirstNode; f != nil {
		node = firstNode{disk: f.DiskUUID, vm: attestation.Instance{Name: f.Name, ID: f.InstanceID}}
	}
	return res, cfg.startServices(ctx, kubeconfig, node, r)
}

// firstNode is the initialised node: its state disk and VM.
type firstNode struct {
	disk string
	vm   attestation.Instance
	// set is the measurement set it attested with.
	set string
}

// recordFirstNode records the initialised node's disk as admitted for the
// VM its attestation named. A node that names no instance or disk (an
// older image) is told to the owner: it will not rejoin after a reboot.
func recordFirstNode(ctx context.Context, kubeconfig string, node firstNode, r *reporter) error {
	if node.disk == "" || node.vm.IsZero() {
		r.notice("The node did not name its state disk or VM, so it is not recorded as admitted: after a reboot it waits for 'orrery recover'")
		return nil
	}
	if err := recordAdmitted(ctx, kubeconfig, admitted.Record{DiskUUID: node.disk, Instance: node.vm, MeasurementSet: node.set}); err != nil {
		return fmt.Errorf("%w\nthe cluster runs; run the same 'orrery init' again to retry", err)
	}
	return nil
}

// onNodeAbsent is Init's answer to a node that does not answer yet: it
// says so now and then, and ends the wait for a node that will never
// answer because it already runs a cluster.
func (cfg InitConfig) onNodeAbsent(ctx context.Context, r *reporter) func(int, error) error {
	return func(attempt int, err error) error {
		// bootstrapperd stops for good once its node belongs to a
		// cluster, so a refused port alone looks like a node still
		// booting; an API server beside it tells the two apart.
		if errors.Is(err, syscall.ECONNREFUSED) && kubeAPIAnswers(ctx, cfg.Node, cfg.APIServerPort) {
			return fmt.Errorf("the node at %s already belongs to a cluster: its Kubernetes API server answers and its bootstrapper has stopped. %s", cfg.Node, otherClusterHint)
		}
		if attempt == 1 || attempt%10 == 0 {
			r.detail(fmt.Sprintf("waiting for %s: %v", cfg.Node, err))
		}
		return nil
	}
}

// otherClusterHint is what the owner can do about a node that belongs to
// a cluster already.
const otherClusterHint = "Use the kubeconfig of the init that set it up; to start another cluster, create new VMs ('orrery mini down', then 'orrery mini up')"

// lockedElsewhere rewords a refused attestation that differs from what
// init expects only in the node lock's PCR: the node is running the right
// image and has been initialised or joined into another cluster, which
// only a reboot-free lock explains (a node still in its bootstrapper's
// hand-over after someone else's init). Any other error, or a refusal
// that names other PCRs too, is returned as it is.
func lockedElsewhere(node string, err error) error {
	var refused *dialer.NotAttestedError
	if !errors.As(err, &refused) {
		return err
	}
	pcrs := measurements.MismatchedPCRs(refused.Err)
	if len(pcrs) == 0 || slices.ContainsFunc(pcrs, func(p uint32) bool { return p != nodelock.PCR }) {
		return err
	}
	return fmt.Errorf("the node at %s already belongs to a cluster: it runs the expected image, but its node lock (PCR %d) holds another cluster's ID. %s\n(%w)",
		node, nodelock.PCR, otherClusterHint, err)
}

// runInit sends the init request and follows the node's progress stream
// until the node reports its result.
// It returns the node's result and the VM the node's attestation named.
func runInit(ctx context.Context, d *dialer.Dialer, cfg InitConfig, req *initpb.InitRequest, r *reporter) (*initpb.InitSuccess, attestation.Instance, error) {
	var none attestation.Instance
	conn, err := d.Conn(cfg.Node)
	if err != nil {
		return nil, none, err
	}
	defer conn.Close()
	stream, err := openInitStream(ctx, conn, req)
	if err != nil {
		return nil, none, err
	}
	kubeadmOut := &toolout.Follower{OnPhase: func(phase string) { r.step(kubeadmStep(phase)) }}
	for {
		resp, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			return nil, none, errors.New("init: the node closed the stream without a result")
		}
		if err != nil {
			return nil, none, streamError(cfg.Node, err)
		}
		switch k := resp.GetKind().(type) {
		case *initpb.InitResponse_Progress:
			r.step(termtext.Line(k.Progress.GetMessage()))
		case *initpb.InitResponse_Log:
			_, _ = kubeadmOut.Write(k.Log.GetData())
			r.emit(ToolOutput, "", k.Log.GetData())
		case *initpb.InitResponse_Failed:
			return nil, none, initFailed(cfg.Workspace, k.Failed, kubeadmOut)
		case *initpb.InitResponse_Done:
			// The stream's context knows the peer once a message came.
			var inst attestation.Instance
			if p, ok := peer.FromContext(stream.Context()); ok {
				if info, ok := p.AuthInfo.(atls.AuthInfo); ok {
					inst = info.PeerInstance
				}
			}
			return k.Done, inst, nil
		}
	}
}

// openInitStream starts the Init call. The node's gRPC server may not
// take calls yet in the first seconds after its attested-TLS port
// answered.
func openInitStream(ctx context.Context, conn *grpc.ClientConn, req *initpb.InitRequest) (initpb.InitService_InitClient, error) {
	for attempt := 1; ; attempt++ {
		stream, err := initpb.NewInitServiceClient(conn).Init(ctx, req)
		if err == nil {
			return stream, nil
		}
		if status.Code(err) != codes.Unavailable || attempt == 5 || ctx.Err() != nil {
			return nil, fmt.Errorf("init: %w", err)
		}
		time.Sleep(2 * time.Second)
	}
}

// streamError turns a broken progress stream into what the owner can do.
func streamError(node string, err error) error {
	st := status.Convert(err)
	switch st.Code() {
	case codes.Unavailable, codes.Canceled, codes.DeadlineExceeded, codes.Unknown, codes.Internal:
		return fmt.Errorf("init on %s: %s (%s); if the connection dropped, run the same command again: the node returns its result", node, termtext.Line(st.Message()), st.Code())
	}
	// The node refused the request as it stands: retrying the same
	// command cannot help.
	return fmt.Errorf("init on %s: %s (%s)", node, termtext.Line(st.Message()), st.Code())
}

// kubeadmWaits says what a kubeadm phase's time is mostly spent on where
// its name does not: kubeadm names a phase when it begins, and some end
// in a wait that belongs to the next one.
var kubeadmWaits = map[string]string{
	// kubeadm starts kubelet, then, before its wait-control-plane phase
	// says anything, waits for the API server to take its admin
	// credentials: that is kubelet starting the static pods and the API
	// server starting, the longest part of init under emulation.
	"kubelet-start":       "until the API server answers",
	"control-plane-check": "controller-manager and scheduler",
}

// kubeadmStep is the step an owner sees for a phase of the node's init:
// kubeadm's phases by name, with what they wait for, and the node's own
// steps around kubeadm as they are.
func kubeadmStep(phase string) string {
	if strings.HasPrefix(phase, "orrery-") {
		return phase
	}
	if w, ok := kubeadmWaits[phase]; ok {
		return "kubeadm " + phase + " (" + w + ")"
	}
	return "kubeadm " + phase
}

// initFailed saves what the node sent about its failure (its journal and
// its control-plane containers' logs) and kubeadm's output, and returns an error with the end of the output,
// where kubeadm says what went wrong.
func initFailed(ws workspace.Dir, f *initpb.InitFailure, kubeadmOut *toolout.Follower) error {
	save := func(name string, data []byte) string {
		path, err := ws.Save(name, data)
		if err != nil {
			return "(could not save it: " + err.Error() + ")"
		}
		return path
	}
	msg := "init failed on the node: " + termtext.Line(f.GetErrorMessage())
	if len(kubeadmOut.Output()) > 0 {
		msg += "\nthe end of kubeadm's output:\n" + indent(termtext.Lines(kubeadmOut.Tail(15)), "    ") +
			"\nall of it is in " + save(workspace.KubeadmLogFile, kubeadmOut.Output())
	}
	return errors.New(msg + "\nthe node's journal and its control-plane containers' logs are in " + save(workspace.JournalFile, f.GetJournal()))
}

func indent(s, prefix string) string {
	return prefix + strings.ReplaceAll(s, "\n", "\n"+prefix)
}

// startServices installs the cluster services and waits until the
// control plane is steady.
func (cfg InitConfig) startServices(ctx context.Context, kubeconfig string, node firstNode, r *reporter) error {
	host, _, err := net.SplitHostPort(cfg.Node)
	if err != nil {
		return fmt.Errorf("node address %q: %w", cfg.Node, err)
	}
	set, err := measurementset.FromPolicy(cfg.Measurements, "")
	if err != nil {
		return fmt.Errorf("the measurements for the join service: %w", err)
	}
	node.set = set.Name
	endpoint := cfg.Endpoint
	if endpoint == "" {
		endpoint = net.JoinHostPort(host, strconv.Itoa(cfg.APIServerPort))
	}
	releases, err := services.Releases(services.Settings{
		APIServer:       endpoint,
		PodCIDR:         clusternet.PodCIDR,
		MeasurementSets: []measurementset.Set{set},
		PlatformCA:      pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: cfg.PlatformCA.Raw}),
	})
	if err != nil {
		return err
	}
	r.step("installing the cluster services (pod network, join service, key service)")
	if err := services.Install(ctx, kubeconfig, releases, servicesTimeout, r.detail); err != nil {
		return fmt.Errorf("%w\nthe cluster runs; run the same 'orrery init' again to retry installing its services", err)
	}
	if err := recordFirstNode(ctx, kubeconfig, node, r); err != nil {
		return err
	}
	r.step("checking that the control plane is healthy and stays so")
	if err := services.WaitSteady(ctx, kubeconfig, steadyTimeout, r.detail); err != nil {
		return fmt.Errorf("%w\nthe control-plane node's journal tells why: kubectl --kubeconfig %s get --raw '/api/v1/nodes/NODE/proxy/logs/?query=kubelet' "+
			"(the API server at %s must answer; 'kubectl get events -A' too); "+
			"run the same 'orrery init' again to check again", err, kubeconfig, host)
	}
	return nil
}

// clusterGone reports whether the node at addr is a new VM rather than
// the node of a cluster initialised there: bootstrapperd's socket never
// listens on a node that belongs to a cluster
// (units/system/bootstrapperd.socket), so a node that answers there with
// no API server beside it waits to be initialised.
func clusterGone(ctx context.Context, addr string, apiServerPort int) bool {
	return bootstrapperListens(ctx, addr) && !kubeAPIAnswers(ctx, addr, apiServerPort)
}

// bootstrapperListens reports whether something accepts connections at
// addr, a node's bootstrapper address. Like kubeAPIAnswers, a hint for an
// error message, not trust.
func bootstrapperListens(ctx context.Context, addr string) bool {
	var d net.Dialer
	return answers(ctx, d.DialContext, addr)
}

// kubeAPIAnswers reports whether a TLS server listens on the Kubernetes
// API port of the node at addr. It is a hint for an error message, not
// trust: the certificate is not checked and nothing is sent.
func kubeAPIAnswers(ctx context.Context, addr string, port int) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	d := tls.Dialer{Config: &tls.Config{InsecureSkipVerify: true}} //nolint:gosec // presence check only
	return answers(ctx, d.DialContext, net.JoinHostPort(host, strconv.Itoa(port)))
}

// answers reports whether dial connects to addr within 5 s.
func answers(ctx context.Context, dial func(ctx context.Context, network, addr string) (net.Conn, error), addr string) bool {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	conn, err := dial(ctx, "tcp", addr)
	if err != nil {
		return false
	}
	conn.Close()
	return true
}
