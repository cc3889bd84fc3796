package charts

import (
	"context"
	"testing"
	"time"

	certv1 "k8s.io/api/certificates/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/orrery-dev/orrery/internal/records/admitted"
	"github.com/orrery-dev/orrery/internal/testkit/apiservertest"
	"github.com/orrery-dev/orrery/internal/testkit/csrtest"
)

// A kubelet's request for a serving certificate asks for no lifetime, and
// the controller manager would sign it for a week. With the charts
// installed, the API server stores it asking for
// admitted.ServingCertLifetime, or for less if it asked for less; other
// signers' requests are left as they were.
func TestServingRequestsAskForHours(t *testing.T) {
	srv := apiservertest.Start(t)
	installCharts(t, srv)
	admin := clientFor(t, srv.Config)
	worker := clientFor(t, srv.ConfigAs(t, "system:node:worker-0", "system:nodes"))
	want := int32(admitted.ServingCertLifetime / time.Second)

	// The API server loads policies asynchronously: dry runs until one is
	// changed.
	deadline := time.Now().Add(30 * time.Second)
	for {
		got := createCSR(t, worker, "probe", certv1.KubeletServingSignerName, nil, metav1.DryRunAll)
		if got != nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the orrery-serving-lifetime policy changed no serving request in 30 s")
		}
		time.Sleep(100 * time.Millisecond)
	}

	for name, tc := range map[string]struct {
		client kubernetes.Interface
		signer string
		asked  *int32
		want   *int32
	}{
		"a kubelet's request, as kubelets make it": {worker, certv1.KubeletServingSignerName, nil, &want},
		"a kubelet's request for a year":           {worker, certv1.KubeletServingSignerName, ptr(int32(365 * 24 * 3600)), &want},
		"a kubelet's request for 10 minutes":       {worker, certv1.KubeletServingSignerName, ptr(int32(600)), ptr(int32(600))},
		"an API client's request":                  {admin, certv1.KubeAPIServerClientSignerName, nil, nil},
		"an API client's request for a year":       {admin, certv1.KubeAPIServerClientSignerName, ptr(int32(365 * 24 * 3600)), ptr(int32(365 * 24 * 3600))},
	} {
		t.Run(name, func(t *testing.T) {
			got := createCSR(t, tc.client, "", tc.signer, tc.asked, "")
			if (got == nil) != (tc.want == nil) || got != nil && *got != *tc.want {
				t.Fatalf("stored expirationSeconds %s, want %s", show(got), show(tc.want))
			}
		})
	}
}

// createCSR submits a request to signer asking for seconds and returns
// the expirationSeconds the API server stored (or would store: dryRun).
func createCSR(t *testing.T, c kubernetes.Interface, name, signer string, seconds *int32, dryRun string) *int32 {
	t.Helper()
	usage := certv1.UsageServerAuth
	if signer != certv1.KubeletServingSignerName {
		usage = certv1.UsageClientAuth
	}
	opts := metav1.CreateOptions{}
	if dryRun != "" {
		opts.DryRun = []string{dryRun}
	}
	csr, err := c.CertificatesV1().CertificateSigningRequests().Create(context.Background(), &certv1.CertificateSigningRequest{
		ObjectMeta: metav1.ObjectMeta{Name: name, GenerateName: "lifetime-"},
		Spec: certv1.CertificateSigningRequestSpec{Request: csrtest.KubeletRequest(t, "worker-0"),
			SignerName: signer, Usages: []certv1.KeyUsage{certv1.UsageDigitalSignature, usage}, ExpirationSeconds: seconds},
	}, opts)
	if err != nil {
		t.Fatalf("submit a request to %s: %v", signer, err)
	}
	return csr.Spec.ExpirationSeconds
}

func show(s *int32) string {
	if s == nil {
		return "none"
	}
	return (time.Duration(*s) * time.Second).String()
}

func ptr[T any](v T) *T { return &v }
