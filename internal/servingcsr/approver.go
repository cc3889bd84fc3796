package servingcsr

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	certv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Reasons on the conditions the approver sets.
const (
	ReasonApproved = "OrreryAdmittedNode"
	ReasonDenied   = "OrreryNotAdmitted"
)

// Requests are the cluster's certificate signing requests to Signer.
// The join service reaches them through its own small API client, so
// that it carries no Kubernetes client library.
type Requests interface {
	// List calls each with every request to Signer, and returns the
	// resource version of the list. It must not hold them all at once:
	// nodes may create as many as they like.
	List(ctx context.Context, each func(*certv1.CertificateSigningRequest)) (string, error)
	// Watch calls changed with each request to Signer added or changed
	// after resourceVersion, until ctx ends or the watch ends (nil when
	// the API server ended it, after a few minutes).
	Watch(ctx context.Context, resourceVersion string, changed func(*certv1.CertificateSigningRequest)) error
	// UpdateApproval writes csr's conditions through its approval
	// subresource.
	UpdateApproval(ctx context.Context, csr *certv1.CertificateSigningRequest) error
}

// Approver decides the cluster's pending requests to Signer: it
// approves what Decide allows and denies what it refuses, with the
// reason in the condition's message. It lists the requests, then watches
// them, and lists again whenever the API server ends the watch.
//
// It watches rather than polls: kubelets ask once per serving
// certificate, and a LIST every 5 s was 12 of an idle API server's ~110
// requests a minute, each answered from etcd. A request it cannot decide
// yet (the records could not be read) it tries again an Interval later,
// by ending the watch then and listing again.
//
// A node's credential may create requests without end. The approver
// takes the requesters in turn, one request each, so that one node's
// flood does not hold up another node's request; and it denies a node's
// requests beyond the newest MaxPendingPerNode.
type Approver struct {
	Requests Requests
	Lookup   Lookup
	Log      *slog.Logger
	// Interval is the wait before a request that could not be decided,
	// or a failed list or watch, is tried again; zero means 5 s.
	Interval time.Duration
}

// MaxPendingPerNode is how many pending requests of one requester the
// approver decides on their merits; it denies the older ones. A kubelet
// asks again only when a request has waited 15 minutes, so it has one
// pending, two across a restart.
const MaxPendingPerNode = 3

// Run decides every pending request, and each new one as it comes, until
// ctx ends.
func (a *Approver) Run(ctx context.Context) error {
	if a.Requests == nil || a.Lookup == nil {
		return errors.New("servingcsr: an approver needs the requests and a lookup")
	}
	r := &run{Approver: a, ctx: ctx, log: a.Log, interval: a.Interval, said: map[string]string{}}
	if r.log == nil {
		r.log = slog.New(slog.DiscardHandler)
	}
	if r.interval == 0 {
		r.interval = 5 * time.Second
	}
	for ctx.Err() == nil {
		r.once()
	}
	return nil
}

// run is one Run of an approver.
type run struct {
	*Approver
	ctx      context.Context
	log      *slog.Logger
	interval time.Duration
	// said is what was said last about each request or the list, so that
	// a lasting failure is logged once, not every Interval.
	said map[string]string
}

func (r *run) say(key, msg string, args ...any) {
	if r.said[key] != msg {
		r.said[key] = msg
		r.log.Warn(msg, args...)
	}
}

// wait waits an interval, or until ctx ends.
func (r *run) wait() {
	select {
	case <-r.ctx.Done():
	case <-time.After(r.interval):
	}
}

// once lists the requests, decides the pending ones, and decides each
// that the watch after the list brings, until the watch ends.
func (r *run) once() {
	q := newQueue()
	rv, err := r.Requests.List(r.ctx, q.add)
	if err != nil {
		r.say("", "cannot list the kubelets' serving certificate requests; trying again", "error", err.Error())
		r.wait()
		return
	}
	delete(r.said, "")
	// A request left undecided ends the watch an Interval later, and the
	// list that follows tries it again.
	watchCtx, cancel := context.WithCancel(r.ctx)
	defer cancel()
	var retry sync.Once
	retryLater := func() { retry.Do(func() { time.AfterFunc(r.interval, cancel) }) }
	watched := make(chan error, 1)
	go func() { watched <- r.Requests.Watch(watchCtx, rv, q.add) }()
	for {
		for {
			it, behind, ok := q.next()
			if !ok {
				break
			}
			if r.consider(it, behind) {
				retryLater()
			}
		}
		select {
		case <-q.ready:
		case err := <-watched:
			// Whether the retry ended the watch, read before cancel ends
			// it in any case: a failed watch must wait, or list and watch
			// loop.
			retried := watchCtx.Err() != nil
			if err != nil && r.ctx.Err() == nil && !retried {
				r.say("", "the watch of the kubelets' serving certificate requests ended; listing them again", "error", err.Error())
				r.wait()
			}
			return
		}
	}
}

// consider decides a request, of which behind newer ones of its
// requester are pending; it tells whether the request is left undecided.
func (r *run) consider(it queued, behind int) bool {
	csr := it.csr
	var verdict error
	flood := false
	switch {
	case behind >= MaxPendingPerNode || it.overflow:
		flood = true
		verdict = &Refused{fmt.Sprintf("%s has %d newer serving certificate requests pending; its newest %d are decided, older ones denied", csr.Spec.Username, behind, MaxPendingPerNode)}
	case it.tooLarge > 0:
		verdict = &Refused{fmt.Sprintf("the request is %d bytes; a kubelet's serving certificate request is under %d", it.tooLarge, MaxRequestBytes)}
	default:
		verdict = Decide(r.ctx, csr, r.Lookup)
	}
	var refused *Refused
	if verdict != nil && !errors.As(verdict, &refused) {
		return r.undecided(csr, verdict)
	}
	if err := r.record(csr, refused); err != nil {
		return r.undecided(csr, err)
	}
	delete(r.said, csr.Name)
	switch {
	case flood:
		// One line per requester for a flood, not one per request.
		r.say("flood "+csr.Spec.Username, "denying the older of a requester's many pending serving certificate requests", "requester", csr.Spec.Username, "pending", behind+1)
	case refused != nil:
		r.log.Warn("denied a kubelet's serving certificate request", "csr", csr.Name, "requester", csr.Spec.Username, "reason", refused.Reason)
	default:
		r.log.Info("approved a kubelet's serving certificate request", "csr", csr.Name, "node", NodeName(csr))
	}
	return false
}

func (r *run) undecided(csr *certv1.CertificateSigningRequest, err error) bool {
	if r.ctx.Err() == nil {
		r.say(csr.Name, "cannot decide a kubelet's serving certificate request yet; trying again", "csr", csr.Name, "error", err.Error())
	}
	return true
}

// record writes the decision on csr: approved, or denied for refused's
// reason.
func (r *run) record(csr *certv1.CertificateSigningRequest, refused *Refused) error {
	cond := certv1.CertificateSigningRequestCondition{
		Type: certv1.CertificateApproved, Status: corev1.ConditionTrue, Reason: ReasonApproved,
		Message:        "node " + NodeName(csr) + " asks for its own admitted names and addresses",
		LastUpdateTime: metav1.Now(),
	}
	if refused != nil {
		cond.Type, cond.Reason, cond.Message = certv1.CertificateDenied, ReasonDenied, refused.Reason
	}
	csr = csr.DeepCopy()
	csr.Status.Conditions = append(csr.Status.Conditions, cond)
	if err := r.Requests.UpdateApproval(r.ctx, csr); err != nil {
		return fmt.Errorf("record the decision on %s: %w", csr.Name, err)
	}
	return nil
}

// isPending reports whether nobody approved or denied csr yet.
func isPending(csr *certv1.CertificateSigningRequest) bool {
	for _, c := range csr.Status.Conditions {
		if c.Type == certv1.CertificateApproved || c.Type == certv1.CertificateDenied {
			return false
		}
	}
	return true
}
