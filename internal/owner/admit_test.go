package owner

import (
	"context"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"

	"github.com/orrery-dev/orrery/internal/attestation"
	"github.com/orrery-dev/orrery/internal/owner/charts"
	"github.com/orrery-dev/orrery/internal/records/admitted"
	"github.com/orrery-dev/orrery/internal/testkit/apiservertest"
)

// init records the first control plane with the address its kubelet
// registered, and adds it to a record an earlier init wrote without one.
func TestRecordFirstNodeWithItsAddress(t *testing.T) {
	srv := apiservertest.Start(t)
	manifest, err := charts.CRDManifest()
	if err != nil {
		t.Fatal(err)
	}
	srv.InstallCRDs(t, manifest)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	nodes := kubernetes.NewForConfigOrDie(srv.Config)
	records := dynamic.NewForConfigOrDie(srv.Config)

	node, err := nodes.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "cp-0"}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := internalAddresses(ctx, nodes, "cp-0"); err == nil || !strings.Contains(err.Error(), "no InternalIP") {
		t.Fatalf("a node with no address: %v", err)
	}
	node.Status.Addresses = []corev1.NodeAddress{{Type: corev1.NodeHostName, Address: "cp-0"}, {Type: corev1.NodeInternalIP, Address: "10.42.1.100"}}
	if _, err := nodes.CoreV1().Nodes().UpdateStatus(ctx, node, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	addrs, err := internalAddresses(ctx, nodes, "cp-0")
	if want := []netip.Addr{netip.MustParseAddr("10.42.1.100")}; err != nil || !slices.Equal(addrs, want) {
		t.Fatalf("internalAddresses = %v, %v; want %v", addrs, err, want)
	}

	rec := admitted.Record{DiskUUID: "0b5c1f3e-8d2a-4c6b-9e7f-1a2b3c4d5e6f", Instance: attestation.Instance{Name: "cp-0", ID: "1"}}
	// An earlier init's record, without addresses (a new CRD's writes
	// may answer 429 while its cache starts).
	for err := createAdmitted(ctx, records, rec); err != nil; err = createAdmitted(ctx, records, rec) {
		if !strings.Contains(err.Error(), "initializing") {
			t.Fatal(err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	rec.Addresses = addrs
	if err := createAdmitted(ctx, records, rec); err != nil {
		t.Fatalf("init again: %v", err)
	}
	obj, err := records.Resource(admittedNodes).Get(ctx, "disk-"+rec.DiskUUID, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	raw, _ := obj.MarshalJSON()
	got, err := admitted.Parse(rec.DiskUUID, raw)
	if err != nil || !slices.Equal(got.Addresses, addrs) {
		t.Fatalf("the record holds %+v, %v; want the node's address", got, err)
	}
}
