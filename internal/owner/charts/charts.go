// Package charts holds the Helm charts `orrery init` installs into a new
// cluster, embedded in the binary so no chart repository is needed.
//
// Every chart's version is the CLI's (internal/buildinfo), stamped when it
// is loaded: a release's chart version says which Orrery installed it,
// and an Orrery whose version is newer offers an upgrade. Orrery's own
// chart has that app version too (its join service is part of the same
// build); flannel keeps upstream's.
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
	OrreryServices = "orrery-services"
)

//go:embed all:flannel all:orrery-services
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
		rel, _ := relPath(name, p)
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
	if name == OrreryServices {
		c.Metadata.AppVersion = version
	}
	return c, nil
}

// Versions are the embedded charts' versions, by chart name.
func Versions() (map[string]string, error) {
	out := map[string]string{}
	for _, name := range []string{Flannel, OrreryServices} {
		c, err := Load(name)
		if err != nil {
			return nil, err
		}
		out[name] = c.Metadata.Version
	}
	return out, nil
}

func relPath(root, p string) (string, error) {
	if p == root {
		return ".", nil
	}
	return p[len(path.Clean(root))+1:], nil
}
