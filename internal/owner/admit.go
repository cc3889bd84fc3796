package owner

import (
	"context"
	"encoding/json"
	"fmt"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/orrery-dev/orrery/internal/records/admitted"
	"github.com/orrery-dev/orrery/internal/records/orreryapi"
)

// admittedNodes is the resource of the record of admitted nodes.
var admittedNodes = schema.GroupVersionResource{Group: orreryapi.Group, Version: orreryapi.Version, Resource: orreryapi.AdmittedNodes}

// recordAdmitted records the initialised node's state disk as admitted
// for it, as the join service records the nodes it admits, so that the
// node can rejoin through another control plane. A record that is there
// already (a retried init) is fine if it names the same VM.
func recordAdmitted(ctx context.Context, kubeconfig string, rec admitted.Record) error {
	rc, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return fmt.Errorf("read kubeconfig: %w", err)
	}
	client, err := dynamic.NewForConfig(rc)
	if err != nil {
		return err
	}
	return createAdmitted(ctx, client, rec)
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
