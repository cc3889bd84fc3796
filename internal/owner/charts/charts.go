// Package charts holds the Helm charts `orrery init` installs into a new
// cluster, embedded in the binary so no chart repository is needed.
//
// Every chart's version is the CLI's (internal/buildinfo), stamped when it
// is loaded: a release's chart version says which Orrery installed it,
// and an Orrery whose version is newer offers an upgrade. Orrery's own
// charts have that app version too (its join service and API are part of
// the same build); flannel keeps upstream's.
package charts

import (
	"embed"
	"fmt"
	"io/fs"
	"path"

	"helm.sh/helm/v3/pkg/chart"
	"helm.sh/helm/v3/pkg/chart/loader"

	"github.com/orrery-dev/orrery/internal/buildinfo"
)

// Names of the embedded charts.
const (
	Flannel        = "flannel"
	OrreryCRDs     = "orrery-crds"
	OrreryServices = "orrery-services"
)

// servicesImage, when set at build time (-ldflags -X), replaces the
// orrery-services chart's image. Only for tests: the end-to-end suite
// builds an orrery whose join service cannot start, to watch an upgrade
// roll back.
var servicesImage string

// Names are the embedded charts.
var Names = []string{Flannel, OrreryCRDs, OrreryServices}

//go:embed all:flannel all:orrery-crds all:orrery-services
var files embed.FS

// Load returns the embedded chart name.
func Load(name string) (*chart.Chart, error) {
	var buffered []*loader.BufferedFile
	err := fs.WalkDir(files, name, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		data, err := files.ReadFile(p)
		if err != nil {
			return err
		}
		rel := relPath(name, p)
		buffered = append(buffered, &loader.BufferedFile{Name: rel, Data: data})
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("read embedded chart %s: %w", name, err)
	}
	c, err := loader.LoadFiles(buffered)
	if err != nil {
		return nil, fmt.Errorf("load embedded chart %s: %w", name, err)
	}
	version := buildinfo.Get().Version
	c.Metadata.Version = version
	if name != Flannel {
		c.Metadata.AppVersion = version
	}
	if name == OrreryServices && servicesImage != "" {
		c.Values["image"] = servicesImage
	}
	return c, nil
}

// Versions are the embedded charts' versions, by chart name.
func Versions() (map[string]string, error) {
	out := map[string]string{}
	for _, name := range Names {
		c, err := Load(name)
		if err != nil {
			return nil, err
		}
		out[name] = c.Metadata.Version
	}
	return out, nil
}

// CRDManifest is the orrery-crds chart's CustomResourceDefinitions as one
// multi-document YAML stream, for tests that install them into an API
// server without Helm.
func CRDManifest() ([]byte, error) {
	c, err := Load(OrreryCRDs)
	if err != nil {
		return nil, err
	}
	var out []byte
	for _, t := range c.Templates {
		out = append(out, "\n---\n"...)
		out = append(out, t.Data...)
	}
	return out, nil
}

func relPath(root, p string) string {
	if p == root {
		return "."
	}
	return p[len(path.Clean(root))+1:]
}
