package upgrade

import (
	"context"
	"slices"

	"github.com/orrery-dev/orrery/internal/owner/charts"
	"github.com/orrery-dev/orrery/internal/records/measurementset"
	"github.com/orrery-dev/orrery/internal/versions"
)

// Report is what 'orrery upgrade check' tells: each release installed
// against available, the Kubernetes versions, and the accepted images.
type Report struct {
	Releases []ReleaseReport `json:"releases"`
	// KubernetesVersion is the cluster's; KubernetesVersions those this
	// orrery's image supports.
	KubernetesVersion  string   `json:"kubernetesVersion"`
	KubernetesVersions []string `json:"kubernetesVersions"`
	// KubernetesUpgrades are the versions among those the cluster may be
	// upgraded to: newer, and at most the next minor.
	KubernetesUpgrades []string `json:"kubernetesUpgrades"`
	// Images are the accepted measurement sets with the nodes that run
	// each; Unknown lists nodes whose image no record names.
	Images  []ImageReport `json:"images"`
	Unknown []string      `json:"nodesOfUnknownImage,omitempty"`
	// Measurements are the images of the measurements files the owner
	// gave, in order.
	Measurements []MeasurementsReport `json:"measurements,omitempty"`
	// UpToDate means an 'upgrade apply' without options changes nothing.
	UpToDate bool `json:"upToDate"`
}

// ReleaseReport is one release.
type ReleaseReport struct {
	Name      string `json:"name"`
	Namespace string `json:"namespace"`
	Installed string `json:"installedVersion,omitempty"`
	Available string `json:"availableVersion"`
	Revision  int    `json:"revision,omitempty"`
	Status    string `json:"status"`
	// Action is what 'upgrade apply' would do: none, upgrade, install,
	// or refuse (with Reason).
	Action string `json:"action"`
	Reason string `json:"reason,omitempty"`
}

// ImageReport is one accepted measurement set.
type ImageReport struct {
	Set   string   `json:"set"`
	Nodes []string `json:"nodes"`
}

// MeasurementsReport says whether the cluster accepts a given image.
type MeasurementsReport struct {
	Set      string `json:"set"`
	Accepted bool   `json:"accepted"`
}

// Check reports on the cluster. given are the sets of measurements files
// the owner asks about.
func Check(ctx context.Context, c *Cluster, given []measurementset.Set) (Report, error) {
	installed, err := c.Read()
	if err != nil {
		return Report{}, err
	}
	images, err := c.Usage(ctx)
	if err != nil {
		return Report{}, err
	}
	r := Report{KubernetesVersion: c.ServerVersion, KubernetesVersions: versions.List(),
		KubernetesUpgrades: versions.UpgradesFrom(c.ServerVersion), UpToDate: true}
	var accepted []string
	for _, inst := range installed {
		rr := ReleaseReport{Name: inst.Ref.Name, Namespace: inst.Ref.Namespace, Installed: inst.ChartVersion, Revision: inst.Revision, Status: string(inst.Status)}
		if inst.Missing {
			rr.Status = "not installed"
		}
		// The plan of this release alone says what apply would do.
		plan, err := MakePlan([]Installed{inst}, charts.Load, Options{})
		switch {
		case err != nil:
			rr.Action, rr.Reason = "refuse", err.Error()
			r.UpToDate = false
		case plan.Changes() && inst.Missing:
			rr.Action = "install"
			r.UpToDate = false
		case plan.Changes():
			rr.Action = "upgrade"
			r.UpToDate = false
		default:
			rr.Action = "none"
		}
		if c, err := charts.Load(inst.Ref.Chart); err == nil {
			rr.Available = c.Metadata.Version
		}
		if inst.Ref.Chart == charts.OrreryServices && !inst.Missing {
			sets, err := measurementset.FromValues(inst.Values[setsValue])
			if err != nil {
				rr.Action, rr.Reason = "refuse", "the accepted images in its values: "+err.Error()
			}
			for _, s := range sets {
				accepted = append(accepted, s.Name)
			}
		}
		r.Releases = append(r.Releases, rr)
	}
	inUse := InUse(images)
	for _, name := range accepted {
		r.Images = append(r.Images, ImageReport{Set: name, Nodes: inUse[name]})
	}
	for _, n := range images {
		if n.Set == "" || !slices.Contains(accepted, n.Set) {
			r.Unknown = append(r.Unknown, n.Node)
		}
	}
	for _, g := range given {
		r.Measurements = append(r.Measurements, MeasurementsReport{Set: g.Name, Accepted: slices.Contains(accepted, g.Name)})
	}
	return r, nil
}
