package servingcsr

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	certv1 "k8s.io/api/certificates/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/orrery-dev/orrery/internal/testkit/apiservertest"
)

// Against a real API server, worker-0's own kubelet credential asks for a
// serving certificate for its own address, and for one that also names
// worker-1's: the first is approved, the second denied, with the reason.
func TestApproverWithARealAPIServer(t *testing.T) {
	srv := apiservertest.Start(t)
	admin := kubernetes.NewForConfigOrDie(srv.Config)
	node := kubernetes.NewForConfigOrDie(srv.ConfigAs(t, "system:node:worker-0", "system:nodes"))
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	submit := func(name string, r request) {
		t.Helper()
		csr := r.csr(t)
		csr.Name = name
		if _, err := node.CertificatesV1().CertificateSigningRequests().Create(ctx, csr, metav1.CreateOptions{}); err != nil {
			t.Fatalf("worker-0 asks for %s: %v", name, err)
		}
	}
	submit("own", kubeletRequest("worker-0", "10.42.1.0"))
	submit("neighbours", kubeletRequest("worker-0", "10.42.1.0", "10.42.1.1"))

	// An hour between retries: what is decided below is decided from the
	// first list or from the watch, never from a second look.
	go (&Approver{Requests: clientRequests{admin}, Lookup: admittedNodes, Interval: time.Hour}).Run(ctx)

	decided := func(name string) certv1.CertificateSigningRequestCondition {
		for {
			csr, err := admin.CertificatesV1().CertificateSigningRequests().Get(ctx, name, metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if len(csr.Status.Conditions) > 0 {
				return csr.Status.Conditions[0]
			}
			select {
			case <-ctx.Done():
				t.Fatalf("%s was never decided", name)
			case <-time.After(100 * time.Millisecond):
			}
		}
	}
	if c := decided("own"); c.Type != certv1.CertificateApproved || c.Reason != ReasonApproved {
		t.Errorf("worker-0's own request: %+v, want approved", c)
	}
	if c := decided("neighbours"); c.Type != certv1.CertificateDenied || !strings.Contains(c.Message, "10.42.1.1") {
		t.Errorf("worker-0's request for worker-1's address: %+v, want denied naming the address", c)
	}
	// A request made after the approver started is decided too, as it
	// comes (the watch).
	submit("later", kubeletRequest("worker-0", "10.42.1.0"))
	if c := decided("later"); c.Type != certv1.CertificateApproved {
		t.Errorf("a later request: %+v, want approved", c)
	}
}

// clientRequests reaches the requests through client-go.
type clientRequests struct{ client kubernetes.Interface }

func (c clientRequests) List(ctx context.Context, each func(*certv1.CertificateSigningRequest)) (string, error) {
	opts := metav1.ListOptions{FieldSelector: "spec.signerName=" + Signer, Limit: 100}
	for {
		l, err := c.client.CertificatesV1().CertificateSigningRequests().List(ctx, opts)
		if err != nil {
			return "", err
		}
		for i := range l.Items {
			each(&l.Items[i])
		}
		if opts.Continue = l.Continue; opts.Continue == "" {
			return l.ResourceVersion, nil
		}
	}
}

func (c clientRequests) Watch(ctx context.Context, rv string, changed func(*certv1.CertificateSigningRequest)) error {
	w, err := c.client.CertificatesV1().CertificateSigningRequests().Watch(ctx, metav1.ListOptions{FieldSelector: "spec.signerName=" + Signer, ResourceVersion: rv})
	if err != nil {
		return err
	}
	defer w.Stop()
	for e := range w.ResultChan() {
		if csr, ok := e.Object.(*certv1.CertificateSigningRequest); ok && (e.Type == "ADDED" || e.Type == "MODIFIED") {
			changed(csr)
		}
	}
	return nil
}

func (c clientRequests) UpdateApproval(ctx context.Context, csr *certv1.CertificateSigningRequest) error {
	_, err := c.client.CertificatesV1().CertificateSigningRequests().UpdateApproval(ctx, csr.Name, csr, metav1.UpdateOptions{})
	return err
}

// fakeRequests serves one list, then a watch that delivers watched and
// blocks until its context ends; it records each decision.
type fakeRequests struct {
	listed  []certv1.CertificateSigningRequest
	watched []certv1.CertificateSigningRequest
	lists   atomic.Int32
	decided chan string
	// watchErr, when set, is what every watch returns at once.
	watchErr error
}

func (f *fakeRequests) List(_ context.Context, each func(*certv1.CertificateSigningRequest)) (string, error) {
	f.lists.Add(1)
	for _, csr := range slices.Clone(f.listed) {
		each(&csr)
	}
	return "1", nil
}

func (f *fakeRequests) Watch(ctx context.Context, _ string, changed func(*certv1.CertificateSigningRequest)) error {
	if f.watchErr != nil {
		return f.watchErr
	}
	for i := range f.watched {
		changed(&f.watched[i])
	}
	f.watched = nil
	<-ctx.Done()
	return nil
}

func (f *fakeRequests) UpdateApproval(_ context.Context, csr *certv1.CertificateSigningRequest) error {
	f.decided <- csr.Name
	return nil
}

// A watch the API server refuses (the account lacked the verb on a
// cluster) is tried again an Interval later, not at once: an approver
// that listed and watched in a loop cost an idle control plane half a
// host core.
func TestApproverWaitsAfterAFailedWatch(t *testing.T) {
	f := &fakeRequests{watchErr: errors.New("watch: API server answered 403 Forbidden")}
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	(&Approver{Requests: f, Lookup: admittedNodes, Interval: 200 * time.Millisecond}).Run(ctx)
	if n := f.lists.Load(); n > 3 {
		t.Errorf("%d lists in 500 ms with a failing watch and a 200 ms interval, want at most 3", n)
	}
}

// A request that could not be decided (the records did not answer) is
// tried again an Interval later, whether the list or the watch brought
// it: the watch ends, and the list after it decides.
func TestApproverRetriesWhatItCouldNotDecide(t *testing.T) {
	for _, via := range []string{"list", "watch"} {
		t.Run(via, func(t *testing.T) {
			csr := *kubeletRequest("worker-0", "10.42.1.0").csr(t)
			csr.Name = "from-" + via
			f := &fakeRequests{decided: make(chan string, 1)}
			if via == "list" {
				f.listed = append(f.listed, csr)
			} else {
				f.watched = append(f.watched, csr)
				f.listed = nil
			}
			var failed atomic.Bool
			lookup := func(ctx context.Context, name string) (Admitted, bool, error) {
				if !failed.Swap(true) {
					// The request is in the cluster from now on: a later
					// list carries it.
					f.listed = []certv1.CertificateSigningRequest{csr}
					return Admitted{}, false, errors.New("the records did not answer")
				}
				return admittedNodes(ctx, name)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			go (&Approver{Requests: f, Lookup: lookup, Interval: 50 * time.Millisecond}).Run(ctx)
			select {
			case name := <-f.decided:
				if name != csr.Name || f.lists.Load() < 2 {
					t.Fatalf("decided %s after %d lists, want %s after a second list", name, f.lists.Load(), csr.Name)
				}
			case <-ctx.Done():
				t.Fatalf("%s was never decided after its lookup failed once (%d lists)", csr.Name, f.lists.Load())
			}
		})
	}
}
