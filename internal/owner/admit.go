package owner

import (
	"context"
	"encoding/json"
	"fmt"
	"net/netip"
	"slices"

	corev1 "k8s.io/api/core/v1"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/orrery-dev/orrery/internal/records/admitted"
	"github.com/orrery-dev/orrery/internal/records/orreryapi"
)

// admittedNodes is the resource of the record of admitted nodes.
var admittedNodes = schema.GroupVersionResource{Group: orreryapi.Group, Version: orreryapi.Version, Resource: orreryapi.AdmittedNodes}

// recordAdmitted records the initialised node's state disk as admitted
// for it, as the join service records the nodes it admits, so that the
// node can rejoin through another control plane, with the node's
// addresses as its kubelet registered them, the only ones its serving
// certificate may name. A record that is there already (a retried init)
// is fine if it names the same VM.
func recordAdmitted(ctx context.Context, kubeconfig string, rec admitted.Record) error {
	rc, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return fmt.Errorf("read kubeconfig: %w", err)
	}
	client, err := dynamic.NewForConfig(rc)
	if err != nil {
		return err
	}
	nodes, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return err
	}
	if rec.Addresses, err = internalAddresses(ctx, nodes, rec.Instance.Name); err != nil {
		return err
	}
	return createAdmitted(ctx, client, rec)
}

// internalAddresses are the InternalIP addresses the kubelet of node
// name registered: the node IP bootstrapperd gave it, as a joining
// node states it to the join service. The first control plane's kubelet
// is the only one in the cluster when init runs, and the node
// authorizer lets no other kubelet write its Node's status later.
func internalAddresses(ctx context.Context, client kubernetes.Interface, name string) ([]netip.Addr, error) {
	node, err := client.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return nil, fmt.Errorf("read the addresses of the initialised node %s: %w", name, err)
	}
	var text []string
	for _, a := range node.Status.Addresses {
		if a.Type == corev1.NodeInternalIP {
			text = append(text, a.Address)
		}
	}
	if len(text) == 0 {
		return nil, fmt.Errorf("the initialised node %s registered no InternalIP address; its kubelet's serving certificate could not be approved: check 'kubectl get node %s -o yaml'", name, name)
	}
	addrs, err := admitted.ParseAddresses(text)
	if err != nil {
		return nil, fmt.Errorf("the addresses of the initialised node %s: %w", name, err)
	}
	return addrs, nil
}

func createAdmitted(ctx context.Context, client dynamic.Interface, rec admitted.Record) error {
	obj, err := rec.Object()
	if err != nil {
		return err
	}
	u, err := runtimeObject(obj)
	if err != nil {
		return err
	}
	_, err = client.Resource(admittedNodes).Create(ctx, u, metav1.CreateOptions{FieldManager: "orrery"})
	if !apierrors.IsAlreadyExists(err) {
		if err != nil {
			return fmt.Errorf("record the state disk of %s as admitted: %w", rec.Instance.Name, err)
		}
		return nil
	}
	have, err := client.Resource(admittedNodes).Get(ctx, u.GetName(), metav1.GetOptions{})
	if err != nil {
		return fmt.Errorf("read the record of the state disk of %s: %w", rec.Instance.Name, err)
	}
	raw, err := have.MarshalJSON()
	if err != nil {
		return err
	}
	got, err := admitted.Parse(rec.DiskUUID, raw)
	if err != nil {
		return err
	}
	if got.Instance != rec.Instance {
		return fmt.Errorf("the cluster records state disk %s as admitted for %s, not for the initialised node %s: delete the record (kubectl delete admittednode %s) only if you know why it is there", rec.DiskUUID, got.Instance, rec.Instance, u.GetName())
	}
	if slices.Equal(got.Addresses, rec.Addresses) {
		return nil
	}
	// An earlier init recorded the node before its addresses were
	// recorded, or before the node registered them.
	patch, err := json.Marshal(map[string]any{"spec": map[string]any{"addresses": admitted.FormatAddresses(rec.Addresses)}})
	if err != nil {
		return err
	}
	if _, err := client.Resource(admittedNodes).Patch(ctx, u.GetName(), types.MergePatchType, patch, metav1.PatchOptions{FieldManager: "orrery"}); err != nil {
		return fmt.Errorf("record the addresses of %s: %w", rec.Instance.Name, err)
	}
	return nil
}

// runtimeObject turns a JSON-ready object into an Unstructured.
func runtimeObject(obj map[string]any) (*unstructured.Unstructured, error) {
	raw, err := json.Marshal(obj)
	if err != nil {
		return nil, err
	}
	u := &unstructured.Unstructured{}
	if err := u.UnmarshalJSON(raw); err != nil {
		return nil, err
	}
	return u, nil
}
