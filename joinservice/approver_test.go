package main

import (
	"context"
	"log/slog"
	"net/http"
	"net/netip"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	certv1 "k8s.io/api/certificates/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/orrery-dev/orrery/internal/attestation"
	"github.com/orrery-dev/orrery/internal/owner/charts"
	"github.com/orrery-dev/orrery/internal/records/admitted"
	"github.com/orrery-dev/orrery/internal/servingcsr"
	"github.com/orrery-dev/orrery/internal/testkit/apiservertest"
	"github.com/orrery-dev/orrery/internal/testkit/csrtest"
	"github.com/orrery-dev/orrery/joinservice/internal/admissions"
	"github.com/orrery-dev/orrery/joinservice/internal/apiserver"
)

// The join service's approver, over its own API client and the records
// its joins wrote, on a real API server: root on worker-0, with its
// kubelet's credential, gets a serving certificate approved for its own
// address and denied for the control plane's.
func TestServingApproverDecidesFromTheRecords(t *testing.T) {
	srv, api, _ := approverCluster(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	for i, n := range []struct{ name, addr string }{{"cp-0", "10.42.1.100"}, {"worker-0", "10.42.1.0"}} {
		admitNode(ctx, t, api, i, n.name, n.addr)
	}
	worker := kubernetes.NewForConfigOrDie(srv.ConfigAs(t, "system:node:worker-0", "system:nodes"))
	submitServingCSR(t, worker, "own", "worker-0", "10.42.1.0")
	submitServingCSR(t, worker, "control-plane", "worker-0", "10.42.1.100")

	a := servingApprover(api, slog.New(slog.DiscardHandler))
	// An hour between retries: the later request below is decided from
	// the approver's watch, never from a second list.
	a.Interval = time.Hour
	go a.Run(ctx)

	admin := kubernetes.NewForConfigOrDie(srv.Config)
	decided := func(name string) certv1.CertificateSigningRequestCondition { return decision(ctx, t, admin, name) }
	if c := decided("own"); c.Type != certv1.CertificateApproved {
		t.Errorf("worker-0's request for its own address: %+v, want approved", c)
	}
	if c := decided("control-plane"); c.Type != certv1.CertificateDenied || !strings.Contains(c.Message, "10.42.1.100") {
		t.Errorf("worker-0's request for the control plane's address: %+v, want denied naming it", c)
	}
	submitServingCSR(t, worker, "later", "worker-0", "10.42.1.0")
	if c := decided("later"); c.Type != certv1.CertificateApproved {
		t.Errorf("a request made while the approver watched: %+v, want approved", c)
	}
}

func submitServingCSR(t *testing.T, c kubernetes.Interface, name, node string, ips ...string) {
	t.Helper()
	if _, err := c.CertificatesV1().CertificateSigningRequests().Create(context.Background(), &certv1.CertificateSigningRequest{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: certv1.CertificateSigningRequestSpec{Request: csrtest.KubeletRequest(t, node, ips...),
			SignerName: servingcsr.Signer, Usages: []certv1.KeyUsage{certv1.UsageDigitalSignature, certv1.UsageServerAuth}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatalf("submit %s: %v", name, err)
	}
}

// countingTransport counts the requests that pass through it.
type countingTransport struct {
	next http.RoundTripper
	n    atomic.Int64
}

func (c *countingTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	c.n.Add(1)
	return c.next.RoundTrip(r)
}

// An approver with nothing to decide waits on its watch: it must not ask
// the API server again and again (an idle control plane pays for every
// request twice, in the API server and in etcd).
func TestServingApproverIsQuietWhenIdle(t *testing.T) {
	srv, api, counting := approverCluster(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	admitNode(ctx, t, api, 0, "cp-0", "10.42.1.100")
	node := kubernetes.NewForConfigOrDie(srv.ConfigAs(t, "system:node:cp-0", "system:nodes"))
	submitServingCSR(t, node, "cp-0", "cp-0", "10.42.1.100")
	go servingApprover(api, slog.New(slog.DiscardHandler)).Run(ctx)
	decision(ctx, t, kubernetes.NewForConfigOrDie(srv.Config), "cp-0")
	before := counting.n.Load()
	time.Sleep(5 * time.Second)
	if n := counting.n.Load() - before; n > 1 {
		t.Errorf("an approver with nothing left to decide made %d requests in 5 s, want at most one (a new watch)", n)
	}
}

// approverCluster is a real API server with Orrery's CRDs, and the join
// service's API client to it, whose requests are counted.
func approverCluster(t *testing.T) (*apiservertest.Server, *apiserver.Conn, *countingTransport) {
	t.Helper()
	srv := apiservertest.Start(t)
	manifest, err := charts.CRDManifest()
	if err != nil {
		t.Fatal(err)
	}
	srv.InstallCRDs(t, manifest)
	httpClient, err := rest.HTTPClientFor(srv.Config)
	if err != nil {
		t.Fatal(err)
	}
	counting := &countingTransport{next: httpClient.Transport}
	httpClient.Transport = counting
	return srv, &apiserver.Conn{Server: srv.Config.Host, HTTP: httpClient}, counting
}

// admitNode records node i, name, as admitted at addr.
func admitNode(ctx context.Context, t *testing.T, api *apiserver.Conn, i int, name, addr string) {
	t.Helper()
	rec := admitted.Record{DiskUUID: "0b5c1f3e-8d2a-4c6b-9e7f-1a2b3c4d5e6" + string(rune('0'+i)), Instance: attestation.Instance{Name: name, ID: name + "-id"},
		Addresses: []netip.Addr{netip.MustParseAddr(addr)}}
	store := &admissions.Store{Conn: api}
	for err := store.Admit(ctx, rec); err != nil; err = store.Admit(ctx, rec) {
		// A new CRD answers 429 until its cache started.
		if !strings.Contains(err.Error(), "429") {
			t.Fatal(err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// decision waits for the first condition of the request name.
func decision(ctx context.Context, t *testing.T, admin kubernetes.Interface, name string) certv1.CertificateSigningRequestCondition {
	t.Helper()
	for ; ; time.Sleep(100 * time.Millisecond) {
		csr, err := admin.CertificatesV1().CertificateSigningRequests().Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if len(csr.Status.Conditions) > 0 {
			return csr.Status.Conditions[0]
		}
	}
}
