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
	// List returns the requests to Signer and the resource version of
	// the list.
	List(ctx context.Context) ([]certv1.CertificateSigningRequest, string, error)
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
type Approver struct {
	Requests Requests
	Lookup   Lookup
	Log      *slog.Logger
	// Interval is the wait before a request that could not be decided,
	// or a failed list or watch, is tried again; zero means 5 s.
	Interval time.Duration
}

// Run decides every pending request, and each new one as it comes, until
// ctx ends.
func (a *Approver) Run(ctx context.Context) error {
	if a.Requests == nil || a.Lookup == nil {
		return errors.New("servingcsr: an approver needs the requests and a lookup")
	}
	log := a.Log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	interval := a.Interval
	if interval == 0 {
		interval = 5 * time.Second
	}
	// What was said last about each request or the list, so that a
	// lasting failure is logged once, not every Interval.
	said := map[string]string{}
	say := func(key, msg string, args ...any) {
		if said[key] != msg {
			said[key] = msg
			log.Warn(msg, args...)
		}
	}
	// consider decides csr if it is pending; it tells whether csr is
	// left undecided.
	consider := func(csr *certv1.CertificateSigningRequest) bool {
		if csr.Spec.SignerName != Signer || !isPending(csr) {
			return false
		}
		if err := a.decide(ctx, csr, log); err != nil && ctx.Err() == nil {
			say(csr.Name, "cannot decide a kubelet's serving certificate request yet; trying again", "csr", csr.Name, "error", err.Error())
			return true
		}
		return false
	}
	wait := func() bool {
		select {
		case <-ctx.Done():
			return false
		case <-time.After(interval):
			return true
		}
	}
	for ctx.Err() == nil {
		csrs, rv, err := a.Requests.List(ctx)
		if err != nil {
			say("", "cannot list the kubelets' serving certificate requests; trying again", "error", err.Error())
			if !wait() {
				break
			}
			continue
		}
		delete(said, "")
		undecided := false
		for i := range csrs {
			undecided = consider(&csrs[i]) || undecided
		}
		// A request left undecided ends the watch an Interval later, and
		// the list that follows tries it again.
		watchCtx, cancel := context.WithCancel(ctx)
		var retry sync.Once
		retryLater := func() { retry.Do(func() { time.AfterFunc(interval, cancel) }) }
		if undecided {
			retryLater()
		}
		err = a.Requests.Watch(watchCtx, rv, func(csr *certv1.CertificateSigningRequest) {
			if consider(csr) {
				retryLater()
			}
		})
		// Whether the retry ended the watch, read before cancel ends it
		// in any case: a failed watch must wait, or list and watch loop.
		retried := watchCtx.Err() != nil
		cancel()
		if err != nil && ctx.Err() == nil && !retried {
			say("", "the watch of the kubelets' serving certificate requests ended; listing them again", "error", err.Error())
			if !wait() {
				break
			}
		}
	}
	return nil
}

// decide approves or denies one request; an error leaves it pending.
func (a *Approver) decide(ctx context.Context, csr *certv1.CertificateSigningRequest, log *slog.Logger) error {
	verdict := Decide(ctx, csr, a.Lookup)
	var refused *Refused
	if verdict != nil && !errors.As(verdict, &refused) {
		return verdict
	}
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
	if err := a.Requests.UpdateApproval(ctx, csr); err != nil {
		return fmt.Errorf("record the decision on %s: %w", csr.Name, err)
	}
	if refused != nil {
		log.Warn("denied a kubelet's serving certificate request", "csr", csr.Name, "requester", csr.Spec.Username, "reason", refused.Reason)
	} else {
		log.Info("approved a kubelet's serving certificate request", "csr", csr.Name, "node", NodeName(csr))
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
