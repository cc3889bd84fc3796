package servingcsr

import (
	"fmt"
	"testing"
	"time"

	certv1 "k8s.io/api/certificates/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func pendingRequest(user, name string, at time.Time) *certv1.CertificateSigningRequest {
	return &certv1.CertificateSigningRequest{
		ObjectMeta: metav1.ObjectMeta{Name: name, CreationTimestamp: metav1.NewTime(at)},
		Spec:       certv1.CertificateSigningRequestSpec{SignerName: Signer, Username: user, Request: []byte("a request")},
	}
}

// The queue serves requesters in turn, each one's oldest first, tells how
// many newer ones wait behind it, and keeps the body of a requester's
// newest MaxPendingPerNode only.
func TestQueueTakesRequestersInTurn(t *testing.T) {
	q := newQueue()
	t0 := time.Unix(1_800_000_000, 0)
	for i := range 10 {
		q.add(pendingRequest("system:node:worker-0", fmt.Sprintf("flood-%d", i), t0.Add(time.Duration(i)*time.Second)))
	}
	q.add(pendingRequest("system:node:worker-1", "w1", t0))
	// The same request again (a watch's MODIFIED) replaces, not adds.
	q.add(pendingRequest("system:node:worker-1", "w1", t0))
	// Another signer's, or a decided one, is not queued.
	other := pendingRequest("system:node:worker-1", "client", t0)
	other.Spec.SignerName = "kubernetes.io/kube-apiserver-client-kubelet"
	q.add(other)
	done := pendingRequest("system:node:worker-1", "done", t0)
	done.Status.Conditions = []certv1.CertificateSigningRequestCondition{{Type: certv1.CertificateApproved}}
	q.add(done)

	var order []string
	for {
		it, behind, ok := q.next()
		if !ok {
			break
		}
		order = append(order, fmt.Sprintf("%s/%d", it.csr.Name, behind))
		if wantBody := behind < MaxPendingPerNode; (it.csr.Spec.Request != nil) != wantBody || it.overflow == wantBody {
			t.Errorf("%s with %d behind it: body kept %v, overflow %v", it.csr.Name, behind, it.csr.Spec.Request != nil, it.overflow)
		}
	}
	want := "[flood-0/9 w1/0 flood-1/8 flood-2/7 flood-3/6 flood-4/5 flood-5/4 flood-6/3 flood-7/2 flood-8/1 flood-9/0]"
	if got := fmt.Sprint(order); got != want {
		t.Errorf("served %s\nwant   %s", got, want)
	}
}
