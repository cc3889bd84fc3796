package servingcsr

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
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
	// List returns the requests to Signer.
	List(ctx context.Context) ([]certv1.CertificateSigningRequest, error)
	// UpdateApproval writes csr's conditions through its approval
	// subresource.
	UpdateApproval(ctx context.Context, csr *certv1.CertificateSigningRequest) error
}

// Approver decides the cluster's pending requests to Signer: it
// approves what Decide allows and denies what it refuses, with the
// reason in the condition's message. It looks every Interval; a request
// it cannot decide yet (the records could not be read) it tries again
// then.
//
// It polls rather than watches: kubelets ask once a year per node (and
// at each new node), the list is filtered by signer, and a node waits
// for its serving certificate a few seconds either way.
type Approver struct {
	Requests Requests
	Lookup   Lookup
	Log      *slog.Logger
	// Interval is the wait between looks; zero means 5 s.
	Interval time.Duration
}

// Run decides every pending request, and looks again every Interval,
// until ctx ends.
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
	tick := time.NewTicker(interval)
	defer tick.Stop()
	for {
		csrs, err := a.Requests.List(ctx)
		if err != nil {
			say("", "cannot list the kubelets' serving certificate requests; trying again", "error", err.Error())
		} else {
			delete(said, "")
		}
		for i := range csrs {
			csr := &csrs[i]
			if csr.Spec.SignerName != Signer || !isPending(csr) {
				continue
			}
			if err := a.decide(ctx, csr, log); err != nil && ctx.Err() == nil {
				say(csr.Name, "cannot decide a kubelet's serving certificate request yet; trying again", "csr", csr.Name, "error", err.Error())
			}
		}
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		}
	}
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
