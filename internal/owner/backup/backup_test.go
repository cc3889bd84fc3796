package backup

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	"sigs.k8s.io/yaml"

	"github.com/orrery-dev/orrery/internal/testkit/apiservertest"
)

const crdName = "widgets.test.orrery.dev"

var widgets = schema.GroupVersionResource{Group: "test.orrery.dev", Version: "v1", Resource: "widgets"}

const crdYAML = `apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  name: widgets.test.orrery.dev
spec:
  group: test.orrery.dev
  scope: Namespaced
  names: {plural: widgets, singular: widget, kind: Widget, listKind: WidgetList}
  versions:
  - name: v1
    served: true
    storage: true
    subresources: {status: {}}
    schema:
      openAPIV3Schema:
        type: object
        properties:
          spec:
            type: object
            properties:
              size: {type: integer}
          status:
            type: object
            properties:
              seen: {type: boolean}
`

// cluster is a real API server with the Widget CRD and n widgets in two
// namespaces.
func cluster(tb testing.TB, n int) dynamic.Interface {
	tb.Helper()
	srv := apiservertest.Start(tb)
	client, err := dynamic.NewForConfig(srv.Config)
	if err != nil {
		tb.Fatal(err)
	}
	ctx := context.Background()
	apply(tb, client, []byte(crdYAML))
	deadline := time.Now().Add(30 * time.Second)
	for {
		if _, err := client.Resource(widgets).Namespace("default").List(ctx, metav1.ListOptions{Limit: 1}); err == nil {
			break
		} else if time.Now().After(deadline) {
			tb.Fatalf("the Widget CRD is not served: %v", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	for _, ns := range []string{"team-a", "team-b"} {
		obj := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "v1", "kind": "Namespace", "metadata": map[string]any{"name": ns}}}
		if _, err := client.Resource(schema.GroupVersionResource{Version: "v1", Resource: "namespaces"}).Create(ctx, obj, metav1.CreateOptions{}); err != nil {
			tb.Fatal(err)
		}
	}
	for i := range n {
		ns := []string{"team-a", "team-b"}[i%2]
		obj := &unstructured.Unstructured{Object: map[string]any{
			"apiVersion": "test.orrery.dev/v1", "kind": "Widget",
			"metadata": map[string]any{"name": fmt.Sprintf("w-%04d", i), "namespace": ns, "annotations": map[string]any{"note": "kept"}},
			"spec":     map[string]any{"size": int64(i)},
		}}
		created, err := client.Resource(widgets).Namespace(ns).Create(ctx, obj, metav1.CreateOptions{})
		if err != nil {
			tb.Fatal(err)
		}
		created.Object["status"] = map[string]any{"seen": true}
		if _, err := client.Resource(widgets).Namespace(ns).UpdateStatus(ctx, created, metav1.UpdateOptions{}); err != nil {
			tb.Fatal(err)
		}
	}
	return client
}

// apply creates or updates the object in y with server-side apply, as
// 'kubectl apply --server-side' would.
func apply(tb testing.TB, client dynamic.Interface, y []byte) {
	tb.Helper()
	var obj unstructured.Unstructured
	if err := yaml.Unmarshal(y, &obj.Object); err != nil {
		tb.Fatal(err)
	}
	gvk := obj.GroupVersionKind()
	gvr := map[string]schema.GroupVersionResource{
		"CustomResourceDefinition": crdResource,
		"Widget":                   widgets,
	}[gvk.Kind]
	j, err := obj.MarshalJSON()
	if err != nil {
		tb.Fatal(err)
	}
	var r dynamic.ResourceInterface = client.Resource(gvr)
	if ns := obj.GetNamespace(); ns != "" {
		r = client.Resource(gvr).Namespace(ns)
	}
	if _, err := r.Patch(context.Background(), obj.GetName(), types.ApplyPatchType, j, metav1.PatchOptions{FieldManager: "test", Force: ptr(true)}); err != nil {
		tb.Fatalf("apply %s %s: %v", gvk.Kind, obj.GetName(), err)
	}
}

func ptr[T any](v T) *T { return &v }

func TestSaveAndRestore(t *testing.T) {
	client := cluster(t, 30)
	ctx := context.Background()
	dir := filepath.Join(t.TempDir(), "orrery-backups", "20261124T010203Z")
	res, err := Save(ctx, client, []string{crdName, "absent.test.orrery.dev"}, dir)
	if err != nil {
		t.Fatal(err)
	}
	if res.CRDs != 1 || res.Resources != 30 || res.Bytes == 0 {
		t.Fatalf("result %+v, want 1 CRD and 30 resources", res)
	}
	crdFile, err := os.ReadFile(filepath.Join(dir, "crds", crdName+".yaml"))
	if err != nil {
		t.Fatal(err)
	}
	w, err := os.ReadFile(filepath.Join(dir, "resources", crdName, "team-b", "w-0007.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	for _, bad := range []string{"resourceVersion", "uid:", "managedFields", "creationTimestamp", "seen: true"} {
		if strings.Contains(string(w), bad) || strings.Contains(string(crdFile), bad) {
			t.Errorf("a saved object keeps %q, which a restore must not send", bad)
		}
	}
	if !strings.Contains(string(w), "size: 7") || !strings.Contains(string(w), "note: kept") {
		t.Errorf("widget w-0007 lost its spec or annotations:\n%s", w)
	}

	// An upgrade that drops the CRD drops its objects with it; the backup
	// brings both back.
	if err := client.Resource(crdResource).Delete(ctx, crdName, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitGone(t, client)
	apply(t, client, crdFile)
	restored := 0
	err = filepath.WalkDir(filepath.Join(dir, "resources"), func(p string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		waitServed(t, client)
		apply(t, client, b)
		restored++
		return nil
	})
	if err != nil || restored != 30 {
		t.Fatalf("restored %d objects (%v), want 30", restored, err)
	}
	got, err := client.Resource(widgets).Namespace("team-b").Get(ctx, "w-0007", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if size, _, _ := unstructured.NestedInt64(got.Object, "spec", "size"); size != 7 {
		t.Fatalf("restored w-0007 has size %d, want 7", size)
	}
	if _, err := Save(ctx, client, []string{crdName}, dir); err == nil || !strings.Contains(err.Error(), "exists already") {
		t.Fatalf("a second backup into the same folder: %v, want a refusal", err)
	}
}

func waitGone(t *testing.T, client dynamic.Interface) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		if _, err := client.Resource(crdResource).Get(context.Background(), crdName, metav1.GetOptions{}); err != nil {
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Fatal("the CRD was not deleted")
}

func waitServed(t *testing.T, client dynamic.Interface) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		_, err := client.Resource(widgets).Namespace("default").List(context.Background(), metav1.ListOptions{Limit: 1})
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the restored CRD is not served: %v", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// A disk that cannot hold the backup: nothing is written, and the error
// says so before any release is touched.
func TestSaveRefusesWhenTheDiskIsFull(t *testing.T) {
	client := cluster(t, 3)
	defer func(f func(string) (int64, error)) { freeSpace = f }(freeSpace)
	freeSpace = func(string) (int64, error) { return 64 << 10, nil }
	parent := t.TempDir()
	dir := filepath.Join(parent, "b")
	_, err := Save(context.Background(), client, []string{crdName}, dir)
	if !errors.Is(err, ErrNoSpace) {
		t.Fatalf("Save = %v, want ErrNoSpace", err)
	}
	if entries, _ := os.ReadDir(parent); len(entries) != 0 {
		t.Fatalf("a refused backup left %d entries", len(entries))
	}
}

func TestFileName(t *testing.T) {
	for in, want := range map[string]string{
		"w-0001":         "w-0001.yaml",
		"a.b.orrery.dev": "a.b.orrery.dev.yaml",
		"..":             "%2e..yaml",
		"../etc/passwd":  "%2e.%2fetc%2fpasswd.yaml",
		"_cluster":       "_cluster.yaml",
		"A":              "%41.yaml",
	} {
		if got := fileName(in); got != want {
			t.Errorf("fileName(%q) = %q, want %q", in, got, want)
		}
	}
}

// BenchmarkSave1000 saves 1,000 custom resources from a real API server
// (the goal: 10 s).
func BenchmarkSave1000(b *testing.B) {
	client := cluster(b, 1000)
	b.ResetTimer()
	for i := range b.N {
		dir := filepath.Join(b.TempDir(), fmt.Sprint(i))
		res, err := Save(context.Background(), client, []string{crdName}, dir)
		if err != nil || res.Resources != 1000 {
			b.Fatalf("%+v %v", res, err)
		}
	}
}
