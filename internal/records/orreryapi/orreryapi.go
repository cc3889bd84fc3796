// Package orreryapi names Orrery's own Kubernetes API: the custom resources
// the orrery-services chart defines (see its templates/crds.yaml) and the
// join service and CLI read and write.
//
// Both kinds are cluster-scoped: they describe the cluster (which images
// may join, which disks were admitted), not something of a namespace.
package orreryapi

// Group and Version of Orrery's resources. v1alpha1 because the shapes
// may still change; the chart's CRDs carry the schema.
const (
	Group      = "orrery.dev"
	Version    = "v1alpha1"
	APIVersion = Group + "/" + Version
)

// The resources, by plural (as in a URL path) and kind.
const (
	MeasurementSets    = "measurementsets"
	MeasurementSetKind = "MeasurementSet"
	AdmittedNodes      = "admittednodes"
	AdmittedNodeKind   = "AdmittedNode"
)

// CRDNames are the CustomResourceDefinitions Orrery's chart owns, by name.
var CRDNames = []string{MeasurementSets + "." + Group, AdmittedNodes + "." + Group}

// Path is the API server path of the cluster-scoped resource plural, or of
// one object of it when name is not empty. name must already be a valid
// object name (callers build it from checked parts).
func Path(plural, name string) string {
	p := "/apis/" + APIVersion + "/" + plural
	if name != "" {
		p += "/" + name
	}
	return p
}
