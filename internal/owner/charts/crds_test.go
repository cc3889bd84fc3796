package charts

import (
	"context"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/orrery-dev/orrery/internal/records/orreryapi"
	"github.com/orrery-dev/orrery/internal/testkit/apiservertest"
)

var (
	measurementSets = schema.GroupVersionResource{Group: orreryapi.Group, Version: orreryapi.Version, Resource: orreryapi.MeasurementSets}
	admittedNodes   = schema.GroupVersionResource{Group: orreryapi.Group, Version: orreryapi.Version, Resource: orreryapi.AdmittedNodes}
)

const (
	digestA = "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"
	disk    = "0b5c1f3e-8d2a-4c6b-9e7f-1a2b3c4d5e6f"
)

// badMeasurementSets are measurements a measurement set must not hold,
// each with what the API server's refusal names; an unknown item is
// pruned rather than refused.
var badMeasurementSets = map[string]struct {
	m    map[string]any
	want string
}{
	"PCR 24":          {map[string]any{"24": map[string]any{"expected": digestA}}, "PCR indexes"},
	"PCR 04":          {map[string]any{"04": map[string]any{"expected": digestA}}, "PCR indexes"},
	"upper-case hex":  {map[string]any{"4": map[string]any{"expected": strings.ToUpper(digestA)}}, "expected"},
	"a short digest":  {map[string]any{"4": map[string]any{"expected": "aa"}}, "expected"},
	"nothing":         {map[string]any{}, "measurements"},
	"only warnOnly":   {map[string]any{"4": map[string]any{"expected": digestA, "warnOnly": true}}, "enforce at least one PCR"},
	"an unknown item": {map[string]any{"4": map[string]any{"expected": digestA, "extra": 1}}, ""},
}

// The API server itself refuses what the join service must never read:
// the schema and rules of Orrery's CRDs, checked by a real API server.
func TestCRDsRefuseBadObjects(t *testing.T) {
	srv := apiservertest.Start(t)
	manifest, err := CRDManifest()
	if err != nil {
		t.Fatal(err)
	}
	srv.InstallCRDs(t, manifest)
	client := srv.Dynamic(t)
	ctx := context.Background()
	create := func(gvr schema.GroupVersionResource, obj map[string]any) error {
		_, err := client.Resource(gvr).Create(ctx, &unstructured.Unstructured{Object: obj}, metav1.CreateOptions{})
		return err
	}
	set := func(name string, m map[string]any) map[string]any {
		return map[string]any{"apiVersion": orreryapi.APIVersion, "kind": orreryapi.MeasurementSetKind,
			"metadata": map[string]any{"name": name}, "spec": map[string]any{"measurements": m}}
	}
	node := func(name, diskUUID, instance string) map[string]any {
		return map[string]any{"apiVersion": orreryapi.APIVersion, "kind": orreryapi.AdmittedNodeKind,
			"metadata": map[string]any{"name": name},
			"spec":     map[string]any{"diskUUID": diskUUID, "instance": map[string]any{"name": instance, "id": "42"}}}
	}

	if err := create(measurementSets, set("image-good", map[string]any{"4": map[string]any{"expected": digestA}, "11": map[string]any{"expected": digestA, "warnOnly": true}})); err != nil {
		t.Fatalf("a valid measurement set was refused: %v", err)
	}
	got, err := client.Resource(measurementSets).Get(ctx, "image-good", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if w, _, _ := unstructured.NestedBool(got.Object, "spec", "measurements", "4", "warnOnly"); w {
		t.Error("warnOnly did not default to false")
	}
	for name, tc := range badMeasurementSets {
		err := create(measurementSets, set("image-bad", tc.m))
		if name == "an unknown item" {
			// Pruned, as the API server does with unknown fields.
			if err != nil {
				t.Errorf("%s: %v", name, err)
			}
			_ = client.Resource(measurementSets).Delete(ctx, "image-bad", metav1.DeleteOptions{})
			continue
		}
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: err = %v, want a refusal naming %q", name, err, tc.want)
		}
	}

	if err := create(admittedNodes, node("disk-"+disk, disk, "worker-0")); err != nil {
		t.Fatalf("a valid record was refused: %v", err)
	}
	if err := create(admittedNodes, node("disk-11111111-1111-1111-1111-111111111111", disk, "worker-1")); err == nil || !strings.Contains(err.Error(), `"disk-" followed by spec.diskUUID`) {
		t.Errorf("a record named after another disk: %v", err)
	}
	if err := create(admittedNodes, node("disk-ABC", "ABC", "worker-1")); err == nil {
		t.Error("a record of a malformed disk UUID was accepted")
	}
	// A record's disk and VM never change; its set does.
	rec, err := client.Resource(admittedNodes).Get(ctx, "disk-"+disk, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	_ = unstructured.SetNestedField(rec.Object, "image-good", "spec", "measurementSet")
	rec, err = client.Resource(admittedNodes).Update(ctx, rec, metav1.UpdateOptions{})
	if err != nil {
		t.Fatalf("updating the record's set: %v", err)
	}
	_ = unstructured.SetNestedField(rec.Object, "worker-9", "spec", "instance", "name")
	if _, err := client.Resource(admittedNodes).Update(ctx, rec, metav1.UpdateOptions{}); err == nil || !strings.Contains(err.Error(), "cannot change") {
		t.Errorf("moving a record to another VM: %v", err)
	}
}
