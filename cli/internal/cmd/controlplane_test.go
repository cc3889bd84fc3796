package cmd

import (
	"bytes"
	"context"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/orrery-dev/orrery/internal/records/controlplanes"
)

func TestApproveControlPlane(t *testing.T) {
	client := fake.NewClientset(&corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Name: controlplanes.ConfigMapName, Namespace: controlplanes.Namespace},
		Data:       map[string]string{"measurementSalt": "c2FsdA==", controlplanes.Key: "1111\n"},
	})
	cms := client.CoreV1().ConfigMaps(controlplanes.Namespace)
	ctx := context.Background()
	var out bytes.Buffer
	if err := approveControlPlane(ctx, cms, "2222", &out); err != nil {
		t.Fatal(err)
	}
	if err := approveControlPlane(ctx, cms, "2222", &out); err != nil || !strings.Contains(out.String(), "already") {
		t.Fatalf("second approval: %v, %q", err, out.String())
	}
	cm, err := cms.Get(ctx, controlplanes.ConfigMapName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	ids, err := controlplanes.Parse(cm.Data[controlplanes.Key])
	if err != nil || strings.Join(ids, " ") != "1111 2222" || cm.Data["measurementSalt"] != "c2FsdA==" {
		t.Fatalf("ConfigMap after approval: %v (%v)", cm.Data, err)
	}
	if err := approveControlPlane(ctx, cms, "22 22", &out); err == nil {
		t.Fatal("an invalid instance ID was approved")
	}
}

func TestApproveControlPlaneWithoutCluster(t *testing.T) {
	cms := fake.NewClientset().CoreV1().ConfigMaps(controlplanes.Namespace)
	err := approveControlPlane(context.Background(), cms, "2222", &bytes.Buffer{})
	if err == nil || !strings.Contains(err.Error(), "orrery init") {
		t.Fatalf("err = %v, want a hint that the cluster is not set up", err)
	}
}
