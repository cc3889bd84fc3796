// Package initserver is bootstrapperd's side of `orrery init`: it turns a
// node that belongs to no cluster into the first control-plane node of a
// new one.
//
// The order matters and is the point of no return: the request is checked
// completely first (nothing changes on a bad request or a wrong init
// secret), the init secret before anything else, because until it matches
// the peer is anyone on the network; then the node lock binds the node to
// the cluster ID for good;
// then the state disk is re-keyed to the key derived from the master
// secret, kubeadm runs, and the master secret is stored for the key service.
// The work continues if the owner's connection drops, and an owner who
// retries with the same master secret gets the result instead of an error.
//
// A daemon that stops after the lock (a crash, a restart) cannot undo it,
// so it must be able to finish: just before the lock, the accepted
// request's settings are written to the state disk (never its secrets).
// A restarted daemon finds them beside a node locked to their cluster ID
// (see Unfinished) and finishes that init when the owner sends the same
// request again, which brings back the master secret. Nothing that could
// open the cluster's disks rests on the node for the meantime.
package initserver

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"encoding/hex"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"time"

	"golang.org/x/crypto/bcrypt"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/orrery-dev/orrery/internal/atomicfile"
	"github.com/orrery-dev/orrery/internal/disk/handoff"
	"github.com/orrery-dev/orrery/internal/keys"
	"github.com/orrery-dev/orrery/internal/proto/initpb"
	"github.com/orrery-dev/orrery/internal/statuslimit"
)

// Locker is the node lock.
type Locker interface {
	TryLock(clusterID []byte) (bool, error)
	IsLocked() (bool, error)
	// LockedTo reports whether the node is locked to exactly clusterID.
	LockedTo(clusterID []byte) (bool, error)
}

// StateDisk is the node's encrypted state disk.
type StateDisk interface {
	// UUID is the LUKS UUID the disk key is bound to.
	UUID(ctx context.Context) (string, error)
	// Rekey replaces the first-boot passphrase with newKey and removes
	// the first-boot key file.
	Rekey(ctx context.Context, newKey []byte) error
}

// Cluster runs kubeadm and talks to the new cluster.
type Cluster interface {
	// Init runs kubeadm init and returns the admin kubeconfig. Output of
	// the tools goes to out.
	Init(ctx context.Context, p ClusterParams, out io.Writer) (kubeconfig []byte, err error)
	// StoreMasterSecret puts the master secret and the measurement salt
	// into the cluster for the key service.
	StoreMasterSecret(ctx context.Context, ms keys.MasterSecret, measurementSalt []byte) error
	// Reset undoes what an interrupted kubeadm init left behind, so that
	// kubeadm's preflight lets it run again.
	Reset(ctx context.Context, out io.Writer) error
}

// ClusterParams is what kubeadm init needs from the request.
type ClusterParams struct {
	KubernetesVersion string   `json:"kubernetesVersion"`
	ClusterName       string   `json:"clusterName"`
	APIServerSANs     []string `json:"apiServerSANs"`
	ServiceCIDR       string   `json:"serviceCIDR"`
	// ControlPlaneEndpoint is HOST:PORT; empty, the node's address.
	ControlPlaneEndpoint string `json:"controlPlaneEndpoint,omitempty"`
	ClusterID            []byte `json:"clusterID"`
}

// Config wires the server to the node.
type Config struct {
	Lock    Locker
	Disk    StateDisk
	Cluster Cluster
	// InitSecretHash returns the bcrypt hash of the init secret, from the
	// metadata service.
	InitSecretHash func(ctx context.Context) ([]byte, error)
	// Supported checks a Kubernetes version against what the image ships.
	Supported func(version string) error
	// Journal returns the node's journal for a failure report; nil means
	// none.
	Journal func(ctx context.Context) ([]byte, error)
	// ResultPath stores the result of a finished init (on the state
	// disk), so a retry by the same owner gets it again.
	ResultPath string
	// RequestPath keeps the settings of the request that takes the node
	// lock (on the state disk, no secrets), so that a restarted daemon
	// can finish that init; empty means init-request.json beside
	// ResultPath.
	RequestPath string
	// RecordOwner keeps the public half of the owner's access key once
	// the node is locked to the new cluster, so that the owner can read
	// the node, a failed init's too, with the inspect service. Nil keeps
	// none (tests of other steps).
	RecordOwner func(ctx context.Context, key ed25519.PublicKey) error
	// Bootstrapped is called once the node is the first node of a
	// cluster and the owner has the result: bootstrapperd stops then, so
	// an owner whose connection dropped must get the result first.
	Bootstrapped func()
	// HandOverGrace is how long a finished init waits for its owner to
	// come back for the result before Bootstrapped is called anyway; zero
	// means 10 minutes.
	HandOverGrace time.Duration
	// CheckNode refuses an init that this node must not take, after the
	// request proved the init secret and passed validation and before
	// anything changes; its error (a gRPC status) goes to the owner. Nil
	// checks nothing.
	CheckNode func(ctx context.Context) error
	// Status reports the phase to systemd (STATUS=), so that
	// 'systemctl status bootstrapperd' shows where an init stands; nil
	// ignores it.
	Status func(string)
	Logger *slog.Logger
}

// Server implements initpb.InitServiceServer.
type Server struct {
	initpb.UnimplementedInitServiceServer
	cfg Config
	log *slog.Logger

	// secretCheck holds the one init-secret check that may run (see
	// checkInitSecret); secretWait is how long a request waits for it.
	secretCheck chan struct{}
	secretWait  time.Duration

	mu  sync.Mutex
	job *job // the one init this node ever runs, once started
}

// New returns an init server.
func New(cfg Config) *Server {
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Server{
		cfg: cfg, log: log.With("component", "initserver"),
		secretCheck: make(chan struct{}, 1), secretWait: 2 * time.Second,
	}
}

func (s *Server) status(msg string) {
	if s.cfg.Status != nil {
		s.cfg.Status(msg)
	}
}

// job is an init in progress or done. Events go to whoever watches; a
// retrying client attaches and gets the final event.
type job struct {
	clusterID []byte
	done      chan struct{}
	result    *initpb.InitResponse // final message, set before done closes
	delivered chan struct{}        // closed once an owner was sent a success
	deliver   sync.Once

	mu       sync.Mutex
	watchers []chan *initpb.InitResponse
}

func (j *job) emit(r *initpb.InitResponse) {
	j.mu.Lock()
	defer j.mu.Unlock()
	for _, w := range j.watchers {
		select {
		case w <- r:
		default: // a slow watcher misses progress, never the result
		}
	}
}

func (j *job) watch() chan *initpb.InitResponse {
	j.mu.Lock()
	defer j.mu.Unlock()
	c := make(chan *initpb.InitResponse, 64)
	j.watchers = append(j.watchers, c)
	return c
}

// Init implements initpb.InitServiceServer. The message of every error
// status it returns is at most statuslimit.MaxMessage bytes.
func (s *Server) Init(req *initpb.InitRequest, stream initpb.InitService_InitServer) error {
	return statuslimit.Cut(s.init(req, stream))
}

func (s *Server) init(req *initpb.InitRequest, stream initpb.InitService_InitServer) error {
	ctx := stream.Context()
	if err := s.checkInitSecret(ctx, req.GetInitSecret()); err != nil {
		return err
	}
	if err := validate(req, s.cfg.Supported); err != nil {
		return status.Errorf(codes.InvalidArgument, "invalid init request: %v", err)
	}
	if s.cfg.CheckNode != nil {
		if err := s.cfg.CheckNode(ctx); err != nil {
			return err
		}
	}
	ms := keys.MasterSecret{Key: req.GetMasterSecret(), Salt: req.GetMasterSecretSalt()}
	measurementSecret, err := ms.MeasurementSecret()
	if err != nil {
		return status.Errorf(codes.InvalidArgument, "%v", err)
	}
	clusterID, err := keys.ClusterID(measurementSecret, req.GetMeasurementSalt())
	if err != nil {
		return status.Errorf(codes.InvalidArgument, "%v", err)
	}

	j, events, err := s.startOrAttach(req, ms, clusterID)
	if err != nil {
		return err
	}
	for {
		select {
		case ev := <-events:
			if err := stream.Send(ev); err != nil {
				return err
			}
		case <-j.done:
			for drained := false; !drained; {
				select {
				case ev := <-events:
					if err := stream.Send(ev); err != nil {
						return err
					}
				default:
					drained = true
				}
			}
			// A Send on a stream whose owner already left can still
			// succeed (it only queues), so the result counts as delivered
			// only if the owner was there when it was sent. Asked after
			// the Send, the question raced with an owner that hangs up
			// the moment it has the result, as orrery init does: under
			// emulation the owner won, and the node kept its port open
			// for the whole hand-over grace. Best effort: the protocol
			// has no receipt.
			present := ctx.Err() == nil
			if err := stream.Send(j.result); err != nil {
				return err
			}
			if j.result.GetDone() != nil && present {
				j.deliver.Do(func() { close(j.delivered) })
			}
			return nil
		case <-ctx.Done():
			// The owner went away; the job goes on and a retry attaches.
			return ctx.Err()
		}
	}
}

// checkInitSecret proves that the peer is the party that created the VM.
// Until it has, the peer is anyone on the network, so nothing else of the
// request is read: whatever its size, a request with a wrong init secret
// costs one bcrypt comparison and an error of fixed size.
//
// bcrypt is slow on purpose, so a flood of requests must not run many
// comparisons side by side: one check runs at a time, and a request that
// cannot start its own within secretWait is refused as Unavailable (which
// orrery init retries). Reading the hash from the metadata service counts
// as part of the check, so a flood does not turn into one either.
func (s *Server) checkInitSecret(ctx context.Context, secret []byte) error {
	if n := len(secret); n == 0 || n > maxInitSecret {
		return status.Errorf(codes.InvalidArgument, "invalid init request: init secret has %d bytes, want 1 to %d", n, maxInitSecret)
	}
	wait := time.NewTimer(s.secretWait)
	defer wait.Stop()
	select {
	case s.secretCheck <- struct{}{}:
		defer func() { <-s.secretCheck }()
	case <-wait.C:
		return status.Error(codes.Unavailable, "the node is busy checking other init requests: try again in a few seconds")
	case <-ctx.Done():
		return status.FromContextError(ctx.Err()).Err()
	}
	hash, err := s.cfg.InitSecretHash(ctx)
	if err != nil {
		return status.Errorf(codes.Unavailable, "read the init secret's hash from the metadata service: %v", err)
	}
	if bcrypt.CompareHashAndPassword(hash, secret) != nil {
		s.log.Warn("init refused: wrong init secret", "phase", "check-request")
		return status.Error(codes.PermissionDenied, "wrong init secret: use the one generated when this VM was created")
	}
	return nil
}

// startOrAttach starts the node's init, or attaches to the one that runs
// or ran, if it is for the same cluster, or resumes the one an earlier run
// of the daemon left after the lock. The returned channel carries the
// job's progress from the moment of attaching.
func (s *Server) startOrAttach(req *initpb.InitRequest, ms keys.MasterSecret, clusterID []byte) (*job, chan *initpb.InitResponse, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.job == nil {
		if r, ok := s.loadResult(); ok {
			s.job = &job{clusterID: r.ClusterID, done: make(chan struct{}), delivered: make(chan struct{}), result: done(r)}
			close(s.job.done)
		}
	}
	if s.job != nil {
		if string(s.job.clusterID) != string(clusterID) {
			return nil, nil, status.Error(codes.FailedPrecondition, "this node is already initialised as part of another cluster")
		}
		s.log.Info("init retried by the owner; returning its result", "phase", "attach", "clusterID", hex.EncodeToString(clusterID))
		return s.job, s.job.watch(), nil
	}
	p, resumed, err := s.resumable(clusterID)
	if err != nil {
		return nil, nil, status.Errorf(codes.Internal, "check for an interrupted init: %v", err)
	}
	if resumed {
		s.log.Info("the owner sent the init again that an earlier run of bootstrapperd left after the node lock; finishing it", "phase", "resume", "clusterID", hex.EncodeToString(clusterID))
	} else {
		p = pending{ClusterParams: ClusterParams{
			KubernetesVersion: req.GetKubernetesVersion(),
			ClusterName:       req.GetClusterName(),
			APIServerSANs:     req.GetApiServerCertSans(),
			ServiceCIDR:       req.GetServiceCidr(),

			ControlPlaneEndpoint: req.GetControlPlaneEndpoint(),
			ClusterID:            clusterID,
		}}
		if err := s.lock(p); err != nil {
			return nil, nil, err
		}
	}
	j := &job{clusterID: clusterID, done: make(chan struct{}), delivered: make(chan struct{})}
	s.job = j
	events := j.watch()
	go s.run(j, p, resumed, ms, req.GetMeasurementSalt())
	return j, events, nil
}

// lock records the request and takes the node lock. The record comes
// first: a daemon that stops between the two leaves a record for an
// unlocked node, which the next request replaces; the other order could
// leave a locked node that no one can finish. A record is only replaced
// while the node is unlocked, so a stranger's request cannot erase the
// owner's way to finish an interrupted init.
func (s *Server) lock(p pending) error {
	locked, err := s.cfg.Lock.IsLocked()
	if err != nil {
		return status.Errorf(codes.Internal, "read the node lock: %v", err)
	}
	if locked {
		return errNodeTaken
	}
	if err := s.saveRequest(p); err != nil {
		return status.Errorf(codes.Internal, "record the init request on the state disk: %v", err)
	}
	locked, err = s.cfg.Lock.TryLock(p.ClusterID)
	if err != nil {
		return status.Errorf(codes.Internal, "take the node lock: %v", err)
	}
	if !locked {
		// The join client won the race; the record is for nothing.
		_ = os.Remove(s.requestPath())
		return errNodeTaken
	}
	return nil
}

var errNodeTaken = status.Error(codes.FailedPrecondition, "this node already belongs to a cluster (it joined one or was initialised): create a new VM to start another cluster")

// resumable returns the recorded init for clusterID if it took the node
// lock and never saved its result.
func (s *Server) resumable(clusterID []byte) (pending, bool, error) {
	p, ok := s.loadRequest()
	if !ok || !bytes.Equal(p.ClusterID, clusterID) {
		return p, false, nil
	}
	mine, err := s.cfg.Lock.LockedTo(clusterID)
	return p, mine, err
}

// Unfinished returns the cluster ID of the init whose request is
// recorded and which saved no result, or nil. If the node is locked to
// exactly that cluster, an earlier run of the daemon stopped in the init
// after taking the lock, and the daemon must stay to finish it once the
// owner sends the request again; bootstrapperd's nodestate asks the lock.
// A damaged record counts as none. It reads only cfg's ResultPath and
// RequestPath.
func Unfinished(cfg Config) []byte {
	s := New(cfg)
	if _, ok := s.loadResult(); ok {
		return nil
	}
	p, ok := s.loadRequest()
	if !ok {
		return nil
	}
	return p.ClusterID
}

func done(r result) *initpb.InitResponse {
	return &initpb.InitResponse{Kind: &initpb.InitResponse_Done{Done: &initpb.InitSuccess{Kubeconfig: r.Kubeconfig, ClusterId: r.ClusterID, StateDiskUuid: r.StateDiskUUID}}}
}

func progress(phase, msg string) *initpb.InitResponse {
	return &initpb.InitResponse{Kind: &initpb.InitResponse_Progress{Progress: &initpb.Progress{Phase: phase, Message: msg}}}
}

// run does the work after the lock. It runs on its own context: a dropped
// connection must not leave a half-initialised node. Every step can run
// again after an interruption: the re-key finishes or is a no-op, and
// kubeadm is reset first if it had started.
func (s *Server) run(j *job, p pending, resumed bool, ms keys.MasterSecret, measurementSalt []byte) {
	ctx := context.Background()
	r := &initRun{s: s, j: j, start: time.Now(), log: s.log.With("clusterID", hex.EncodeToString(j.clusterID))}
	if resumed {
		r.phase("node-lock", "node locked to the new cluster (resuming the init a restart of bootstrapperd interrupted)")
	} else {
		r.phase("node-lock", "node locked to the new cluster")
	}
	res, err := r.steps(ctx, p, ms, measurementSalt)
	if err != nil {
		r.fail(ctx, err)
		return
	}
	r.log.Info("bootstrapped", "phase", "done", "duration", time.Since(r.start).Round(time.Second))
	j.result = done(res)
	close(j.done)
	s.handOver(j, r.log)
}

// initRun is one init after the node lock.
type initRun struct {
	s     *Server
	j     *job
	start time.Time
	log   *slog.Logger
}

// recordOwner keeps the public half of the owner's access key for the
// inspect service.
func (r *initRun) recordOwner(ctx context.Context, st *initState) error {
	if r.s.cfg.RecordOwner == nil {
		return nil
	}
	k, err := st.ms.OwnerAccessKey()
	if err != nil {
		return err
	}
	return r.s.cfg.RecordOwner(ctx, k.Public().(ed25519.PublicKey))
}

// stepError names the step of an init that failed.
type stepError struct {
	step string
	err  error
}

func (e *stepError) Error() string { return e.step + ": " + e.err.Error() }

func (r *initRun) phase(name, msg string) {
	r.log.Info(msg, "phase", name, "elapsed", time.Since(r.start).Round(time.Millisecond))
	r.s.status("init: " + msg)
	r.j.emit(progress(name, msg))
}

// fail ends the job with err and the node's journal.
func (r *initRun) fail(ctx context.Context, err error) {
	step := "init"
	var se *stepError
	if errors.As(err, &se) {
		step = se.step
	}
	r.log.Error("init failed", "phase", step, "error", err)
	r.s.status("init failed: " + step)
	var journal []byte
	if r.s.cfg.Journal != nil {
		journal, _ = r.s.cfg.Journal(ctx)
	}
	r.j.result = &initpb.InitResponse{Kind: &initpb.InitResponse_Failed{Failed: &initpb.InitFailure{
		ErrorMessage: err.Error(), Journal: journal,
	}}}
	close(r.j.done)
}

// initState is what an init's steps hand each other.
type initState struct {
	p               pending
	ms              keys.MasterSecret
	measurementSalt []byte
	// diskUUID is the state disk's, read by the re-key.
	diskUUID   string
	kubeconfig []byte
	// res is the init's result, once saved.
	res result
}

// initStep is one step of an init after the node lock. A step with a
// phase tells the owner when it starts; fails names it in the error if
// it fails.
type initStep struct {
	phase, say string
	fails      string
	// when, if set, says whether the step is needed.
	when func(*initState) bool
	run  func(*initRun, context.Context, *initState) error
}

// initSteps are an init's steps after the node lock, in order. Each can
// run again after an interruption: the re-key finishes or is a no-op, the
// records are written anew, and kubeadm is reset first if it had started.
var initSteps = []initStep{
	{phase: "rekey-state-disk", say: "re-keying the state disk with the key derived from the master secret", run: (*initRun).rekey},
	// The initrd of every later boot computes the cluster ID from it.
	{fails: "record the measurement salt on the state disk", run: (*initRun).recordSalt},
	{fails: "record the owner's access key on the state disk", run: (*initRun).recordOwner},
	{phase: "kubeadm-reset", say: "undoing the interrupted kubeadm init", fails: "reset the interrupted kubeadm init",
		when: func(st *initState) bool { return st.p.KubeadmStarted }, run: (*initRun).resetKubeadm},
	{fails: "record the init's progress on the state disk", run: (*initRun).markKubeadmStarted},
	{phase: "kubeadm-init", say: "running kubeadm init (this takes a few minutes)", fails: "run kubeadm init", run: (*initRun).kubeadmInit},
	{phase: "store-master-secret", say: "storing the master secret for the key service", fails: "store the master secret in the cluster", run: (*initRun).storeMasterSecret},
	{fails: "save the init result", run: (*initRun).saveResult},
}

// steps runs initSteps; it returns the init's result.
func (r *initRun) steps(ctx context.Context, p pending, ms keys.MasterSecret, measurementSalt []byte) (result, error) {
	st := &initState{p: p, ms: ms, measurementSalt: measurementSalt}
	for _, step := range initSteps {
		if step.when != nil && !step.when(st) {
			continue
		}
		if step.phase != "" {
			r.phase(step.phase, step.say)
		}
		if err := step.run(r, ctx, st); err != nil {
			var se *stepError
			if step.fails != "" && !errors.As(err, &se) {
				err = &stepError{step.fails, err}
			}
			return result{}, err
		}
	}
	return st.res, nil
}

// rekey re-keys the state disk and keeps its UUID.
func (r *initRun) rekey(ctx context.Context, st *initState) error {
	uuid, err := r.s.cfg.Disk.UUID(ctx)
	if err != nil {
		return &stepError{"read the state disk's UUID", err}
	}
	diskKey, err := st.ms.DiskKey(uuid)
	if err != nil {
		return &stepError{"derive the disk key", err}
	}
	if err := r.s.cfg.Disk.Rekey(ctx, diskKey); err != nil {
		return &stepError{"re-key the state disk", err}
	}
	st.diskUUID = uuid
	return nil
}

func (r *initRun) recordSalt(_ context.Context, st *initState) error {
	return handoff.WriteMeasurementSalt(filepath.Join(filepath.Dir(r.s.cfg.ResultPath), handoff.MeasurementSaltName), st.measurementSalt)
}

func (r *initRun) kubeadmOutput() io.Writer { return &chunkWriter{emit: r.j.emit, source: "kubeadm"} }

func (r *initRun) resetKubeadm(ctx context.Context, _ *initState) error {
	return r.s.cfg.Cluster.Reset(ctx, r.kubeadmOutput())
}

// markKubeadmStarted records that kubeadm may have changed the node, so
// that an init resumed after a restart resets it first.
func (r *initRun) markKubeadmStarted(_ context.Context, st *initState) error {
	st.p.KubeadmStarted = true
	return r.s.saveRequest(st.p)
}

func (r *initRun) kubeadmInit(ctx context.Context, st *initState) error {
	kubeconfig, err := r.s.cfg.Cluster.Init(ctx, st.p.ClusterParams, r.kubeadmOutput())
	st.kubeconfig = kubeconfig
	return err
}

func (r *initRun) storeMasterSecret(ctx context.Context, st *initState) error {
	return r.s.cfg.Cluster.StoreMasterSecret(ctx, st.ms, st.measurementSalt)
}

func (r *initRun) saveResult(_ context.Context, st *initState) error {
	st.res = result{ClusterID: r.j.clusterID, Kubeconfig: st.kubeconfig, StateDiskUUID: st.diskUUID}
	return r.s.saveResult(st.res)
}

// handOver waits for the owner to take the result (or for the grace
// period), then reports the node bootstrapped.
func (s *Server) handOver(j *job, log *slog.Logger) {
	grace := s.cfg.HandOverGrace
	if grace == 0 {
		grace = 10 * time.Minute
	}
	select {
	case <-j.delivered:
	case <-time.After(grace):
		log.Warn("the owner did not come back for the init result; stopping anyway (the kubeconfig stays on the node in /etc/kubernetes/admin.conf)", "phase", "done", "waited", grace)
	}
	if s.cfg.Bootstrapped != nil {
		s.cfg.Bootstrapped()
	}
}

// result is what a finished init leaves on the state disk (mode 0600:
// the kubeconfig is the cluster's admin credential).
type result struct {
	ClusterID  []byte `json:"clusterID"`
	Kubeconfig []byte `json:"kubeconfig"`
	// StateDiskUUID goes to the owner, who records the disk as admitted
	// for this node (the join service records the others).
	StateDiskUUID string `json:"stateDiskUUID"`
}

func (s *Server) saveResult(r result) error { return writeJSON(s.cfg.ResultPath, r) }

// pending is the record of the init that takes the node lock: what the
// owner asked for, without the secrets, and how far it got. Mode 0600
// although nothing in it is secret: only bootstrapperd has any business
// with it.
type pending struct {
	ClusterParams
	// KubeadmStarted means kubeadm init may have left files and
	// containers that a second run must reset first.
	KubeadmStarted bool `json:"kubeadmStarted"`
}

func (s *Server) requestPath() string {
	if s.cfg.RequestPath != "" {
		return s.cfg.RequestPath
	}
	return filepath.Join(filepath.Dir(s.cfg.ResultPath), "init-request.json")
}

func (s *Server) saveRequest(p pending) error { return writeJSON(s.requestPath(), p) }

func (s *Server) loadRequest() (pending, bool) {
	var p pending
	raw, err := os.ReadFile(s.requestPath())
	if err != nil {
		return p, false
	}
	if err := json.Unmarshal(raw, &p); err != nil || len(p.ClusterID) == 0 {
		s.log.Error("ignoring a damaged init request record", "path", s.requestPath(), "error", err)
		return p, false
	}
	return p, true
}

// writeJSON replaces path atomically and durably: a daemon stopped
// halfway, or a power cut, leaves the old version or the new one, never a
// torn file that would read as no record at all.
func writeJSON(path string, v any) error {
	raw, err := json.Marshal(v)
	if err != nil {
		return err
	}
	return atomicfile.WriteFile(path, raw, 0o600)
}

func (s *Server) loadResult() (result, bool) {
	var r result
	raw, err := os.ReadFile(s.cfg.ResultPath)
	if err != nil {
		return r, false
	}
	if err := json.Unmarshal(raw, &r); err != nil || len(r.ClusterID) == 0 {
		s.log.Error("ignoring a damaged init result file", "path", s.cfg.ResultPath, "error", err)
		return r, false
	}
	return r, true
}

// chunkWriter turns tool output into LogChunk messages of at most 64 KiB.
type chunkWriter struct {
	emit   func(*initpb.InitResponse)
	source string
}

func (w *chunkWriter) Write(p []byte) (int, error) {
	for off := 0; off < len(p); off += 64 << 10 {
		end := min(off+64<<10, len(p))
		data := append([]byte(nil), p[off:end]...)
		w.emit(&initpb.InitResponse{Kind: &initpb.InitResponse_Log{Log: &initpb.LogChunk{Source: w.source, Data: data}}})
	}
	return len(p), nil
}
