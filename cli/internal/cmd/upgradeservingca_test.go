package cmd

import (
	"errors"
	"strings"
	"testing"

	admissionv1 "k8s.io/api/admissionregistration/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/orrery-dev/orrery/internal/owner/kubeupgrade"
)

// A cluster whose control planes check kubelets against the cluster CA
// moves only once its services carry the policy that asks serving
// certificates for hours (the approver denies a request without it).
func TestServingCAMoveWaitsForTheServices(t *testing.T) {
	state := kubeupgrade.State{Nodes: []kubeupgrade.Node{
		{Name: "cp-0", ControlPlane: true, KubeletCA: "/etc/kubernetes/pki/ca.crt"},
		{Name: "worker-0"},
	}}
	client := fake.NewClientset()
	_, err := planServingCA(t.Context(), client, state)
	if !errors.Is(err, kubeupgrade.ErrRefused) || !strings.Contains(err.Error(), "without --kubernetes-version first") {
		t.Fatalf("a move before the services: %v, want a refusal that says what to run", err)
	}
	policy := &admissionv1.MutatingAdmissionPolicy{ObjectMeta: metav1.ObjectMeta{Name: servingLifetimePolicy}}
	if _, err := client.AdmissionregistrationV1().MutatingAdmissionPolicies().Create(t.Context(), policy, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	m, err := planServingCA(t.Context(), client, state)
	if err != nil || !m.needed() || len(m.move) != 1 || m.move[0].Name != "cp-0" {
		t.Fatalf("planServingCA = %+v, %v; want cp-0 to move", m, err)
	}
	var out strings.Builder
	writeServingCAPlan(&out, m)
	if !strings.Contains(out.String(), "cp-0") || !strings.Contains(out.String(), "'kubectl logs' and 'exec'") {
		t.Errorf("the plan says %q: it should name the control plane and what stops working", out.String())
	}
}
