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
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
)

// Reasons on the conditions the approver sets.
const (
	ReasonApproved = "OrreryAdmittedNode"
	ReasonDenied   = "OrreryNotAdmitted"
)

// Approver decides the cluster's pending requests to Signer as they come:
// it approves what Decide allows and denies what it refuses, with the
// reason in the condition's message. A request it cannot decide yet (the
// records could not be read) it tries again after Retry.
type Approver struct {
	Client kubernetes.Interface
	Lookup Lookup
	Log    *slog.Logger
	// Retry is the wait before a request is decided again; zero means
	// 10 s.
	Retry time.Duration
}

// Run decides every pending request, then each new one, until ctx ends.
func (a *Approver) Run(ctx context.Context) error {
	if a.Client == nil || a.Lookup == nil {
		return errors.New("servingcsr: an approver needs a client and a lookup")
	}
	if a.Log == nil {
		a.Log = slog.New(slog.DiscardHandler)
	}
	if a.Retry == 0 {
		a.Retry = 10 * time.Second
	}
	factory := informers.NewSharedInformerFactoryWithOptions(a.Client, 10*time.Minute,
		informers.WithTweakListOptions(func(o *metav1.ListOptions) {
			o.FieldSelector = fields.OneTermEqualSelector("spec.signerName", Signer).String()
		}))
	informer := factory.Certificates().V1().CertificateSigningRequests().Informer()
	pending := make(chan *certv1.CertificateSigningRequest, 64)
	handle := func(obj any) {
		if csr, ok := obj.(*certv1.CertificateSigningRequest); ok && isPending(csr) {
			select {
			case pending <- csr:
			case <-ctx.Done():
			}
		}
	}
	if _, err := informer.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    handle,
		UpdateFunc: func(_, obj any) { handle(obj) },
	}); err != nil {
		return err
	}
	factory.Start(ctx.Done())
	defer factory.Shutdown()
	for {
		select {
		case <-ctx.Done():
			return nil
		case csr := <-pending:
			if err := a.decide(ctx, csr); err != nil {
				a.Log.Warn("cannot decide a kubelet's serving certificate request yet; trying again", "csr", csr.Name, "error", err.Error())
				// Again from the informer's copy: another replica may
				// have decided it meanwhile.
				time.AfterFunc(a.Retry, func() {
					if obj, ok, _ := informer.GetStore().Get(csr); ok {
						handle(obj)
					}
				})
			}
		}
	}
}

// decide approves or denies one request; an error leaves it pending.
func (a *Approver) decide(ctx context.Context, csr *certv1.CertificateSigningRequest) error {
	verdict := Decide(csr, a.Lookup)
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
	if _, err := a.Client.CertificatesV1().CertificateSigningRequests().UpdateApproval(ctx, csr.Name, csr, metav1.UpdateOptions{}); err != nil {
		return fmt.Errorf("record the decision on %s: %w", csr.Name, err)
	}
	if refused != nil {
		a.Log.Warn("denied a kubelet's serving certificate request", "csr", csr.Name, "requester", csr.Spec.Username, "reason", refused.Reason)
	} else {
		a.Log.Info("approved a kubelet's serving certificate request", "csr", csr.Name, "node", NodeName(csr))
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
