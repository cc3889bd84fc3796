package apiservertest

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/restmapper"
	"sigs.k8s.io/yaml"
)

// CRDResource is the resource of CustomResourceDefinitions.
var CRDResource = schema.GroupVersionResource{Group: "apiextensions.k8s.io", Version: "v1", Resource: "customresourcedefinitions"}

// Dynamic is a dynamic client of the server.
func (s *Server) Dynamic(tb testing.TB) dynamic.Interface {
	tb.Helper()
	c, err := dynamic.NewForConfig(s.Config)
	if err != nil {
		tb.Fatal(err)
	}
	return c
}

// InstallCRDs applies the CustomResourceDefinitions of a multi-document
// YAML manifest (documents of other kinds are an error) and waits until
// the API server serves each.
func (s *Server) InstallCRDs(tb testing.TB, manifest []byte) {
	tb.Helper()
	client := s.Dynamic(tb)
	ctx := context.Background()
	var names []string
	for _, doc := range splitDocuments(manifest) {
		var obj unstructured.Unstructured
		if err := yaml.Unmarshal(doc, &obj.Object); err != nil {
			tb.Fatal(err)
		}
		if obj.GetKind() != "CustomResourceDefinition" {
			tb.Fatalf("InstallCRDs: a %s in the manifest", obj.GetKind())
		}
		j, err := obj.MarshalJSON()
		if err != nil {
			tb.Fatal(err)
		}
		force := true
		if _, err := client.Resource(CRDResource).Patch(ctx, obj.GetName(), types.ApplyPatchType, j, metav1.PatchOptions{FieldManager: "apiservertest", Force: &force}); err != nil {
			tb.Fatalf("apply CRD %s: %v", obj.GetName(), err)
		}
		names = append(names, obj.GetName())
	}
	for _, name := range names {
		waitEstablished(tb, client, name)
	}
}

func waitEstablished(tb testing.TB, client dynamic.Interface, name string) {
	tb.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		crd, err := client.Resource(CRDResource).Get(context.Background(), name, metav1.GetOptions{})
		if err == nil {
			conds, _, _ := unstructured.NestedSlice(crd.Object, "status", "conditions")
			for _, c := range conds {
				m, _ := c.(map[string]any)
				if m["type"] == "Established" && m["status"] == "True" {
					return
				}
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
	tb.Fatalf("CRD %s not established after 30 s", name)
}

// splitDocuments splits a YAML stream at its '---' lines and drops the
// documents that hold only comments or nothing.
func splitDocuments(manifest []byte) [][]byte {
	var docs [][]byte
	for _, d := range strings.Split("\n"+string(manifest), "\n---") {
		var obj map[string]any
		if err := yaml.Unmarshal([]byte(d), &obj); err == nil && len(obj) == 0 {
			continue
		}
		docs = append(docs, bytes.TrimSpace([]byte(d)))
	}
	return docs
}

// Apply applies every object of a multi-document YAML manifest, of any
// kind the server serves, in order (server-side apply, as admin).
// Namespaced objects without a namespace go to "default".
func (s *Server) Apply(tb testing.TB, manifest []byte) {
	tb.Helper()
	client := s.Dynamic(tb)
	disc, err := discovery.NewDiscoveryClientForConfig(s.Config)
	if err != nil {
		tb.Fatal(err)
	}
	mapper := restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(disc))
	for _, doc := range splitDocuments(manifest) {
		var obj unstructured.Unstructured
		if err := yaml.Unmarshal(doc, &obj.Object); err != nil {
			tb.Fatalf("apply: %v in\n%s", err, doc)
		}
		gvk := obj.GroupVersionKind()
		m, err := mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
		if err != nil {
			tb.Fatalf("apply %s %s: %v", gvk.Kind, obj.GetName(), err)
		}
		var r dynamic.ResourceInterface = client.Resource(m.Resource)
		if m.Scope.Name() == meta.RESTScopeNameNamespace {
			if obj.GetNamespace() == "" {
				obj.SetNamespace("default")
			}
			r = client.Resource(m.Resource).Namespace(obj.GetNamespace())
		}
		j, err := obj.MarshalJSON()
		if err != nil {
			tb.Fatal(err)
		}
		force := true
		if _, err := r.Patch(context.Background(), obj.GetName(), types.ApplyPatchType, j, metav1.PatchOptions{FieldManager: "apiservertest", Force: &force}); err != nil {
			tb.Fatalf("apply %s %s: %v", gvk.Kind, obj.GetName(), err)
		}
	}
}
