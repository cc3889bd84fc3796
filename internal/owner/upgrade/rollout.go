package upgrade

import (
	"context"
	"fmt"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
)

// Helm's wait takes a DaemonSet as ready once every node runs a pod of the
// new revision, ready or not, as long as its maxUnavailable covers those
// pods: with the default of one and a single control plane, a join service
// whose new pod could never start passed as upgraded (seen in the e2e
// suite). So a release is ready only once every DaemonSet and Deployment
// in it runs all of its pods from the new spec, and all of them are ready.

func (w Workload) String() string { return w.Kind + " " + w.Namespace + "/" + w.Name }

func (w Workload) resource() schema.GroupVersionResource {
	return schema.GroupVersionResource{Group: "apps", Version: "v1", Resource: strings.ToLower(w.Kind) + "s"}
}

// notReady says what keeps a DaemonSet's or Deployment's pods from all
// being of its current spec and ready; "" when nothing does.
func notReady(kind string, obj *unstructured.Unstructured) string {
	status := func(field string) int64 {
		v, _, _ := unstructured.NestedInt64(obj.Object, "status", field)
		return v
	}
	if status("observedGeneration") < obj.GetGeneration() {
		return "its controller has not taken up the new spec yet"
	}
	var want, updated, ready, total int64
	switch kind {
	case "DaemonSet":
		want, updated, ready = status("desiredNumberScheduled"), status("updatedNumberScheduled"), status("numberReady")
		total = status("currentNumberScheduled")
	case "Deployment":
		want = 1
		if r, found, _ := unstructured.NestedInt64(obj.Object, "spec", "replicas"); found {
			want = r
		}
		updated, ready, total = status("updatedReplicas"), status("readyReplicas"), status("replicas")
	}
	if updated < want || ready < want || total > want {
		return fmt.Sprintf("%d of %d pods run the new spec, %d ready", updated, want, ready)
	}
	return ""
}

// awaitRollout waits until every workload in manifest runs all of its pods
// from its current spec and they are ready. When ctx ends first, it says
// which are not, and why.
func awaitRollout(ctx context.Context, client dynamic.Interface, manifest, namespace string) error {
	ws := workloads(manifest, namespace)
	for {
		var waiting []string
		for _, w := range ws {
			// Asked even when ctx has just ended, so the error says why.
			gctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
			obj, err := client.Resource(w.resource()).Namespace(w.Namespace).Get(gctx, w.Name, metav1.GetOptions{})
			cancel()
			why := ""
			if err != nil {
				why = err.Error()
			} else {
				why = notReady(w.Kind, obj)
			}
			if why != "" {
				waiting = append(waiting, fmt.Sprintf("%s: %s (kubectl -n %s describe %s %s)", w, why, w.Namespace, strings.ToLower(w.Kind), w.Name))
			}
		}
		if len(waiting) == 0 {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("not ready in time: %s", strings.Join(waiting, "; "))
		case <-time.After(2 * time.Second):
		}
	}
}
