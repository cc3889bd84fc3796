package main

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/asn1"
	"encoding/pem"
	"fmt"
	"log/slog"
	"net/http"
	"net/netip"
	"path"
	"slices"
	"strings"
	"sync"
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
	if _, err := c.CertificatesV1().CertificateSigningRequests().Create(context.Background(), servingCSR(t, name, node, ips...), metav1.CreateOptions{}); err != nil {
		t.Fatalf("submit %s: %v", name, err)
	}
}

// servingCSR is the request node's kubelet makes for a serving
// certificate for ips.
func servingCSR(t *testing.T, name, node string, ips ...string) *certv1.CertificateSigningRequest {
	return &certv1.CertificateSigningRequest{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: certv1.CertificateSigningRequestSpec{Request: csrtest.KubeletRequest(t, node, ips...),
			SignerName: servingcsr.Signer, Usages: []certv1.KeyUsage{certv1.UsageDigitalSignature, certv1.UsageServerAuth},
			// What the orrery-serving-lifetime admission policy sets.
			ExpirationSeconds: &servingLifetime},
	}
}

var servingLifetime = int32(admitted.ServingCertLifetime / time.Second)

// countingTransport counts the requests that pass through it, and
// keeps the names of the requests whose approval was written, in order.
type countingTransport struct {
	next http.RoundTripper
	n    atomic.Int64

	mu        sync.Mutex
	decisions []string
	// pages are the limits of the lists of signing requests asked for.
	pages []string
}

func (c *countingTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	c.n.Add(1)
	c.mu.Lock()
	if name, ok := strings.CutSuffix(r.URL.Path, "/approval"); ok && r.Method == http.MethodPut {
		c.decisions = append(c.decisions, path.Base(name))
	}
	if limit := r.URL.Query().Get("limit"); strings.HasSuffix(r.URL.Path, "/certificatesigningrequests") && limit != "" {
		c.pages = append(c.pages, limit)
	}
	c.mu.Unlock()
	return c.next.RoundTrip(r)
}

func (c *countingTransport) decided() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.decisions)
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

// Root on worker-0 floods the API server with serving certificate
// requests under its kubelet's credential, some as large as the API
// server stores. The approver still reads them all (no answer of the API
// server's holds them), decides worker-1's request in its turn, not after
// the flood, and denies worker-0's older requests and its large ones,
// saying why.
func TestServingApproverOutlastsAFlood(t *testing.T) {
	srv, api, counting := approverCluster(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	admitNode(ctx, t, api, 0, "worker-0", "10.42.1.0")
	admitNode(ctx, t, api, 1, "worker-1", "10.42.1.1")
	cfg := srv.ConfigAs(t, "system:node:worker-0", "system:nodes")
	cfg.QPS, cfg.Burst = 1000, 1000
	worker0 := kubernetes.NewForConfigOrDie(cfg)

	// About 1.4 MiB of ordinary requests in one list, more than one
	// answer the join service reads; then four of about 1.2 MiB each in
	// JSON: more than a list page or a watch event used to hold, and
	// together more than a page of the approver's now, which it asks for
	// again with fewer.
	const flood = 700
	large := []string{"large-0", "large-1", "large-2", "large-3"}
	floodRequests(ctx, t, worker0, flood, large)
	worker1 := kubernetes.NewForConfigOrDie(srv.ConfigAs(t, "system:node:worker-1", "system:nodes"))
	submitServingCSR(t, worker1, "worker-1", "worker-1", "10.42.1.1")

	a := servingApprover(api, slog.New(slog.DiscardHandler))
	a.Interval = time.Hour
	go a.Run(ctx)
	admin := kubernetes.NewForConfigOrDie(srv.Config)
	if c := decision(ctx, t, admin, "worker-1"); c.Type != certv1.CertificateApproved {
		t.Fatalf("worker-1's request during worker-0's flood: %+v, want approved", c)
	}
	counting.mu.Lock()
	pages := slices.Clone(counting.pages)
	counting.mu.Unlock()
	if !slices.Contains(pages, "50") || !slices.ContainsFunc(pages, func(l string) bool { return l != "50" }) {
		t.Errorf("the list asked for pages of %v; want pages of 50, and a smaller one where the large requests made a page too long", pages)
	}
	if at := slices.Index(counting.decided(), "worker-1"); at > 1 {
		t.Errorf("worker-1's request was decided after %d of worker-0's, want at most one before it", at)
	}

	// Then the whole flood is decided: the newest three on their merits,
	// the older ones denied as a flood.
	var flooded, approved, tooLarge int
	for i := range flood {
		c := decision(ctx, t, admin, fmt.Sprintf("flood-%03d", i))
		switch {
		case c.Type == certv1.CertificateDenied && strings.Contains(c.Message, "newer serving certificate requests pending"):
			flooded++
		case c.Type == certv1.CertificateApproved:
			approved++
		default:
			t.Errorf("flood-%03d: %+v", i, c)
		}
	}
	for _, name := range large {
		switch c := decision(ctx, t, admin, name); {
		case c.Type == certv1.CertificateDenied && strings.Contains(c.Message, "bytes"):
			tooLarge++
		case c.Type == certv1.CertificateDenied && strings.Contains(c.Message, "newer serving certificate requests pending"):
			flooded++
		default:
			t.Errorf("%s: %+v, want denied for its size or as a flood", name, c)
		}
	}
	// The newest three are three of the large ones: the fourth is denied
	// as a flood, and every ordinary request too.
	if flooded != flood+1 || approved != 0 || tooLarge != 3 {
		t.Errorf("%d denied as a flood (want %d), %d approved (want 0), %d denied for their size (want 3)", flooded, flood+1, approved, tooLarge)
	}
}

// floodRequests has worker-0 ask for n ordinary serving certificates,
// four at a time, then for one each named large, each with a 640 KiB
// extension.
func floodRequests(ctx context.Context, t *testing.T, worker0 kubernetes.Interface, n int, large []string) {
	t.Helper()
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Go(func() {
			for i := g; i < n; i += 4 {
				if _, err := worker0.CertificatesV1().CertificateSigningRequests().Create(ctx, servingCSR(t, fmt.Sprintf("flood-%03d", i), "worker-0", "10.42.1.0"), metav1.CreateOptions{}); err != nil {
					t.Errorf("flood-%03d: %v", i, err)
					return
				}
			}
		})
	}
	wg.Wait()
	if t.Failed() {
		t.FailNow()
	}
	for _, name := range large {
		if _, err := worker0.CertificatesV1().CertificateSigningRequests().Create(ctx, &certv1.CertificateSigningRequest{
			ObjectMeta: metav1.ObjectMeta{Name: name},
			Spec: certv1.CertificateSigningRequestSpec{Request: largeKubeletRequest(t, "worker-0", 640<<10),
				SignerName: servingcsr.Signer, Usages: []certv1.KeyUsage{certv1.UsageDigitalSignature, certv1.UsageServerAuth}, ExpirationSeconds: &servingLifetime},
		}, metav1.CreateOptions{}); err != nil {
			t.Fatalf("submit %s: %v", name, err)
		}
	}
}

// largeKubeletRequest is a valid kubelet serving request for node,
// carrying an extension of size bytes.
func largeKubeletRequest(t *testing.T, node string, size int) []byte {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	filler, err := asn1.Marshal(make([]byte, size))
	if err != nil {
		t.Fatal(err)
	}
	der, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{
		Subject:         pkix.Name{CommonName: "system:node:" + node, Organization: []string{"system:nodes"}},
		DNSNames:        []string{node},
		ExtraExtensions: []pkix.Extension{{Id: asn1.ObjectIdentifier{1, 3, 6, 1, 4, 1, 99999, 1}, Value: filler}},
	}, key)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: der})
}
