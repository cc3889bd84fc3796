package apiserver

import (
	"context"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/orrery-dev/orrery/internal/records/removednodes"
	"github.com/orrery-dev/orrery/internal/testkit/apiservertest"
)

func connect(t *testing.T) (*Conn, kubernetes.Interface) {
	t.Helper()
	srv := apiservertest.Start(t)
	httpClient, err := rest.HTTPClientFor(srv.Config)
	if err != nil {
		t.Fatal(err)
	}
	admin, err := kubernetes.NewForConfig(srv.Config)
	if err != nil {
		t.Fatal(err)
	}
	return &Conn{Server: srv.Config.Host, HTTP: httpClient}, admin
}

// A Node being deleted is gone for the join service, even while a
// finalizer keeps the object: a worker's writer that added one must not
// keep a deleted node rejoining.
func TestNodeExists(t *testing.T) {
	c, admin := connect(t)
	ctx := context.Background()
	for _, n := range []*corev1.Node{
		{ObjectMeta: metav1.ObjectMeta{Name: "worker-0"}},
		{ObjectMeta: metav1.ObjectMeta{Name: "worker-1", Finalizers: []string{"example.com/keep"}}},
	} {
		if _, err := admin.CoreV1().Nodes().Create(ctx, n, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	if err := admin.CoreV1().Nodes().Delete(ctx, "worker-1", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string]bool{"worker-0": true, "worker-1": false, "worker-2": false} {
		got, err := c.NodeExists(ctx, name)
		if err != nil || got != want {
			t.Errorf("NodeExists(%s) = %v, %v; want %v", name, got, err, want)
		}
	}
}

func TestRemovedNodes(t *testing.T) {
	c, admin := connect(t)
	ctx := context.Background()
	if l, err := c.RemovedNodes(ctx); err != nil || len(l) != 0 {
		t.Fatalf("no list yet: %v, %v; want none removed", l, err)
	}
	at := time.Date(2026, 11, 27, 12, 0, 0, 0, time.UTC)
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: removednodes.ConfigMapName, Namespace: removednodes.Namespace},
		Data: map[string]string{"worker-1": removednodes.Entry{InstanceID: "42", RemovedAt: at}.Value()}}
	if _, err := admin.CoreV1().ConfigMaps(removednodes.Namespace).Create(ctx, cm, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	l, err := c.RemovedNodes(ctx)
	if err != nil || l["worker-1"].InstanceID != "42" || !l["worker-1"].RemovedAt.Equal(at) {
		t.Fatalf("RemovedNodes = %v, %v", l, err)
	}
	// A list that cannot be read refuses rather than admits.
	cm.Data["worker-2"] = "not JSON"
	if _, err := admin.CoreV1().ConfigMaps(removednodes.Namespace).Update(ctx, cm, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.RemovedNodes(ctx); err == nil || !strings.Contains(err.Error(), "worker-2") {
		t.Fatalf("a garbled list: err = %v, want one naming the entry", err)
	}
}

// The cluster's version is kubeadm's: what 'kubeadm init' wrote and
// 'kubeadm upgrade apply' moves. A record without one gives no version.
func TestKubernetesVersion(t *testing.T) {
	c, admin := connect(t)
	ctx := context.Background()
	if v, err := c.KubernetesVersion(ctx); err == nil || !strings.Contains(err.Error(), "404") {
		t.Fatalf("no kubeadm-config: %q, %v; want an error naming the 404", v, err)
	}
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "kubeadm-config", Namespace: "kube-system"},
		Data: map[string]string{"ClusterConfiguration": "apiVersion: kubeadm.k8s.io/v1beta4\nkind: ClusterConfiguration\nkubernetesVersion: v1.37.2\nclusterName: orrery\n"}}
	if _, err := admin.CoreV1().ConfigMaps("kube-system").Create(ctx, cm, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if v, err := c.KubernetesVersion(ctx); err != nil || v != "v1.37.2" {
		t.Fatalf("KubernetesVersion = %q, %v; want v1.37.2", v, err)
	}
	for name, data := range map[string]map[string]string{
		"no ClusterConfiguration": {"other": "x"},
		"no version":              {"ClusterConfiguration": "kind: ClusterConfiguration\n"},
		"not YAML":                {"ClusterConfiguration": "{{{"},
	} {
		cm.Data = data
		if _, err := admin.CoreV1().ConfigMaps("kube-system").Update(ctx, cm, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		if v, err := c.KubernetesVersion(ctx); err == nil {
			t.Errorf("%s: KubernetesVersion = %q, want an error", name, v)
		}
	}
}
