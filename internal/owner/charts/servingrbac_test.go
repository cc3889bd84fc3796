package charts

import (
	"context"
	"testing"

	certv1 "k8s.io/api/certificates/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
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

// The join service's account may create, read and take over the claims
// (Leases in kube-system) that keep one address to one node; a worker's
// kubelet may not create one there, so it cannot claim an address ahead
// of the node that will have it.
func TestOnlyTheJoinServiceClaimsAddresses(t *testing.T) {
	srv := apiservertest.Start(t)
	installCharts(t, srv)
	ctx := context.Background()
	worker := clientFor(t, srv.ConfigAs(t, "system:node:worker-0", "system:nodes"))
	joinService := clientFor(t, srv.ConfigAs(t, "system:serviceaccount:kube-system:orrery-joinservice",
		"system:serviceaccounts", "system:serviceaccounts:kube-system", "system:authenticated"))
	claim := func(name string) *coordinationv1.Lease {
		holder := "0b5c1f3e-8d2a-4c6b-9e7f-1a2b3c4d5e60"
		return &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: coordinationv1.LeaseSpec{HolderIdentity: &holder}}
	}
	if _, err := worker.CoordinationV1().Leases("kube-system").Create(ctx, claim("orrery-claim-worker"), metav1.CreateOptions{}); !apierrors.IsForbidden(err) {
		t.Errorf("a worker's kubelet creating a claim: %v, want forbidden", err)
	}
	leases := joinService.CoordinationV1().Leases("kube-system")
	if _, err := leases.Create(ctx, claim("orrery-claim-join"), metav1.CreateOptions{}); err != nil {
		t.Fatalf("the join service creating a claim: %v", err)
	}
	if _, err := leases.Get(ctx, "orrery-claim-join", metav1.GetOptions{}); err != nil {
		t.Errorf("the join service reading a claim: %v", err)
	}
	if _, err := leases.Patch(ctx, "orrery-claim-join", types.MergePatchType, []byte(`{"spec":{"holderIdentity":"11111111-1111-1111-1111-111111111111"}}`), metav1.PatchOptions{}); err != nil {
		t.Errorf("the join service taking a claim over: %v", err)
	}
	if err := leases.Delete(ctx, "orrery-claim-join", metav1.DeleteOptions{}); !apierrors.IsForbidden(err) {
		t.Errorf("the join service deleting a claim: %v, want forbidden", err)
	}
}
