package charts

import (
	"context"
	"testing"

	certv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/orrery-dev/orrery/internal/testkit/apiservertest"
	"github.com/orrery-dev/orrery/internal/testkit/csrtest"
)

// The join service's account may decide requests to the kubelet-serving
// signer and no other signer's; a worker's kubelet may decide none, not
// even its own.
func TestOnlyTheJoinServiceDecidesServingRequests(t *testing.T) {
	srv := apiservertest.Start(t)
	installCharts(t, srv)
	ctx := context.Background()
	admin := clientFor(t, srv.Config)
	worker := clientFor(t, srv.ConfigAs(t, "system:node:worker-0", "system:nodes"))
	joinService := clientFor(t, srv.ConfigAs(t, "system:serviceaccount:kube-system:orrery-joinservice",
		"system:serviceaccounts", "system:serviceaccounts:kube-system", "system:authenticated"))

	serving := submitCSR(t, worker, "serving", certv1.KubeletServingSignerName, certv1.UsageServerAuth)
	client := submitCSR(t, admin, "client", certv1.KubeAPIServerClientSignerName, certv1.UsageClientAuth)

	if err := approve(ctx, worker, serving); !apierrors.IsForbidden(err) {
		t.Errorf("a worker's kubelet approving its own serving request: %v, want forbidden", err)
	}
	l, err := joinService.CertificatesV1().CertificateSigningRequests().List(ctx, metav1.ListOptions{FieldSelector: "spec.signerName=" + certv1.KubeletServingSignerName})
	if err != nil || len(l.Items) != 1 {
		t.Fatalf("the join service listing the serving requests: %v, %v", l, err)
	}
	// Its approver waits on a watch: without the verb every watch was
	// refused, and it listed every 5 s instead.
	w, err := joinService.CertificatesV1().CertificateSigningRequests().Watch(ctx, metav1.ListOptions{
		FieldSelector: "spec.signerName=" + certv1.KubeletServingSignerName, ResourceVersion: l.ResourceVersion})
	if err != nil {
		t.Fatalf("the join service watching the serving requests: %v", err)
	}
	w.Stop()
	if err := approve(ctx, joinService, serving); err != nil {
		t.Errorf("the join service approving a serving request: %v", err)
	}
	if err := approve(ctx, joinService, client); !apierrors.IsForbidden(err) {
		t.Errorf("the join service approving an API client certificate: %v, want forbidden", err)
	}
}

func submitCSR(t *testing.T, c kubernetes.Interface, name, signer string, usage certv1.KeyUsage) *certv1.CertificateSigningRequest {
	t.Helper()
	csr, err := c.CertificatesV1().CertificateSigningRequests().Create(context.Background(), &certv1.CertificateSigningRequest{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: certv1.CertificateSigningRequestSpec{Request: csrtest.KubeletRequest(t, "worker-0"),
			SignerName: signer, Usages: []certv1.KeyUsage{certv1.UsageDigitalSignature, usage}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("submit %s: %v", name, err)
	}
	return csr
}

func approve(ctx context.Context, c kubernetes.Interface, csr *certv1.CertificateSigningRequest) error {
	csr = csr.DeepCopy()
	csr.Status.Conditions = append(csr.Status.Conditions, certv1.CertificateSigningRequestCondition{
		Type: certv1.CertificateApproved, Status: corev1.ConditionTrue, Reason: "Test"})
	_, err := c.CertificatesV1().CertificateSigningRequests().UpdateApproval(ctx, csr.Name, csr, metav1.UpdateOptions{})
	return err
}
