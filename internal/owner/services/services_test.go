package services

import (
	"bytes"
	"context"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/orrery-dev/orrery/internal/attestation/measurements"
	"github.com/orrery-dev/orrery/internal/records/measurementset"
	"github.com/orrery-dev/orrery/internal/records/removednodes"
	"github.com/orrery-dev/orrery/internal/testkit/apiservertest"
)

func TestReleases(t *testing.T) {
	set, err := measurementset.New(measurements.M{11: {Expected: bytes.Repeat([]byte{1}, 32)}}, "")
	if err != nil {
		t.Fatal(err)
	}
	rs, err := Releases(Settings{APIServer: "10.42.1.100:6443", PodCIDR: "10.244.0.0/16",
		MeasurementSets: []measurementset.Set{set}, PlatformCA: []byte("PEM")})
	if err != nil {
		t.Fatal(err)
	}
	byName := map[string]Release{}
	var order []string
	for _, r := range rs {
		byName[r.Name] = r
		order = append(order, r.Name)
	}
	if len(order) != 3 || order[0] != "orrery-crds" || order[2] != "orrery-services" {
		t.Errorf("releases in order %v: the CRDs must come before the services that have objects of them", order)
	}
	// flanneld reaches the API server directly: it must not wait for
	// kube-proxy's Service rules, which need the pod network first.
	api, _ := byName["flannel"].Values["apiServer"].(map[string]any)
	if api["host"] != "10.42.1.100" || api["port"] != "6443" || byName["flannel"].Values["podCIDR"] != "10.244.0.0/16" {
		t.Errorf("flannel values %v", byName["flannel"].Values)
	}
	svc := byName["orrery-services"].Values
	if svc["endpoint"] != "10.42.1.100:6443" || svc["apiServerPort"] != "6443" || svc["platformCA"] != "PEM" {
		t.Errorf("orrery-services values %v", svc)
	}
	got, err := measurementset.FromValues(svc["measurementSets"])
	if err != nil || len(got) != 1 || got[0].Name != set.Name || !got[0].Measurements.Equal(set.Measurements) {
		t.Errorf("measurementSets value reads back as %v, %v", got, err)
	}
	if _, err := Releases(Settings{APIServer: "10.42.1.100", MeasurementSets: []measurementset.Set{set}}); err == nil {
		t.Error("an API server address without a port was accepted")
	}
	if _, err := Releases(Settings{APIServer: "10.42.1.100:6443"}); err == nil {
		t.Error("releases without a measurement set were accepted")
	}
}

// TestRemovedNodesListMadeOnceAndKept checks, on a real API server, that
// init makes the removed-node list when there is none and leaves a list
// that names nodes as it is (a retried init must not bring them back).
func TestRemovedNodesListMadeOnceAndKept(t *testing.T) {
	srv := apiservertest.Start(t)
	client, err := kubernetes.NewForConfig(srv.Config)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if err := EnsureRemovedNodesList(ctx, client); err != nil {
		t.Fatal(err)
	}
	cms := client.CoreV1().ConfigMaps(removednodes.Namespace)
	cm, err := cms.Get(ctx, removednodes.ConfigMapName, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("no list after init: %v", err)
	}
	if l, err := removednodes.Parse(cm.Data); err != nil || len(l) != 0 {
		t.Errorf("a new cluster's list = %v, %v; want it empty", l, err)
	}
	cm.Data = removednodes.ConfigMap(removednodes.List{"worker-1": {InstanceID: "4711", RemovedAt: time.Unix(0, 0)}}).Data
	if _, err := cms.Update(ctx, cm, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := EnsureRemovedNodesList(ctx, client); err != nil {
		t.Fatalf("init again: %v", err)
	}
	cm, err = cms.Get(ctx, removednodes.ConfigMapName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if l, err := removednodes.Parse(cm.Data); err != nil || l["worker-1"].InstanceID != "4711" {
		t.Errorf("after init again the list = %v, %v; want worker-1 still on it", l, err)
	}
}
