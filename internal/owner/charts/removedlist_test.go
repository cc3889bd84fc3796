package charts

import (
	"context"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/orrery-dev/orrery/internal/records/removednodes"
	"github.com/orrery-dev/orrery/internal/testkit/apiservertest"
)

// TestWritesDoNotWaitForTheRemovedList checks, against a real API server
// with the charts installed, what the orrery-removed-nodes policy costs
// every write in the cluster, here the controller manager's renewals of
// its leader lease. Without the list, the API server asks itself for it
// on each write, with a 1 s deadline, and fails the write when it cannot
// answer in time (as it did under TCG with three control planes). With
// the list there ('orrery init' creates it), it reads its cache and asks
// nobody.
func TestWritesDoNotWaitForTheRemovedList(t *testing.T) {
	srv := apiservertest.Start(t)
	installCharts(t, srv)
	ctx := context.Background()
	kcm := clientFor(t, srv.ConfigAs(t, "system:kube-controller-manager"))
	renew := newLeaseRenewer(t, kcm)

	lookups := func() int {
		n := 0
		for _, r := range srv.SelfRequests(t) {
			if r.Verb == "get" && r.ObjectRef.Resource == "configmaps" && r.ObjectRef.Namespace == removednodes.Namespace && r.ObjectRef.Name == removednodes.ConfigMapName {
				n++
			}
		}
		return n
	}
	// The policy is loaded asynchronously: once a write asks for the
	// list, it is in force.
	deadline := time.Now().Add(30 * time.Second)
	for before := lookups(); ; {
		renew()
		if lookups() > before {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the orrery-removed-nodes policy never looked its list up in 30 s")
		}
		time.Sleep(100 * time.Millisecond)
	}
	before := lookups()
	for range 5 {
		renew()
	}
	if n := lookups() - before; n < 5 {
		t.Fatalf("without the list, 5 writes made %d lookups of it; the check below could not tell a lookup from none", n)
	}

	admin := clientFor(t, srv.Config)
	if _, err := admin.CoreV1().ConfigMaps(removednodes.Namespace).Create(ctx, removednodes.ConfigMap(nil), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// The API server's cache sees the list a moment after it is made.
	deadline = time.Now().Add(30 * time.Second)
	for {
		before := lookups()
		renew()
		if lookups() == before {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("with the list made 30 s ago, writes still make the API server ask itself for it")
		}
		time.Sleep(100 * time.Millisecond)
	}
	before = lookups()
	for range 20 {
		renew()
	}
	if n := lookups() - before; n != 0 {
		t.Errorf("with the list in place, 20 writes made %d lookups of it: each can fail the write of an overloaded API server", n)
	}
}

// newLeaseRenewer returns a function that renews the controller manager's
// leader lease as it does, failing the test if a renewal is refused.
func newLeaseRenewer(t *testing.T, kcm kubernetes.Interface) func() {
	t.Helper()
	leases := kcm.CoordinationV1().Leases("kube-system")
	holder := "cp-0_test"
	lease, err := leases.Create(context.Background(), &coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{Name: "kube-controller-manager"},
		Spec:       coordinationv1.LeaseSpec{HolderIdentity: &holder},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("the controller manager creating its lease: %v", err)
	}
	return func() {
		t.Helper()
		now := metav1.NewMicroTime(time.Now())
		lease.Spec.RenewTime = &now
		lease, err = leases.Update(context.Background(), lease, metav1.UpdateOptions{})
		if err != nil {
			t.Fatalf("the controller manager renewing its lease: %v", err)
		}
	}
}
