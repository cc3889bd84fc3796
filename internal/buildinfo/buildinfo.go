// Package buildinfo says which build of Orrery a program is: its version,
// which also versions the Helm charts the CLI carries, and the commit it
// was built from.
package buildinfo

import (
	"runtime/debug"
	"strings"

	"golang.org/x/mod/semver"
)

// Version is Orrery's version, SemVer 2 without a leading "v". A release
// build may set it with
//
//	-ldflags "-X github.com/orrery-dev/orrery/internal/buildinfo.Version=0.3.0"
//
// and so may a test that needs a newer build than this one.
var Version = "0.2.0"

// Info describes a build.
type Info struct {
	// Version is Version, checked: "0.0.0-invalid" if it is not SemVer.
	Version string `json:"version"`
	// Commit is the VCS revision the build came from, empty if unknown
	// (built outside a checkout, or with -buildvcs=false).
	Commit string `json:"commit,omitempty"`
	// CommitTime is the commit's time, RFC 3339.
	CommitTime string `json:"commitTime,omitempty"`
	// Modified says the checkout had uncommitted changes.
	Modified  bool   `json:"modified,omitempty"`
	GoVersion string `json:"goVersion"`
}

// Get returns this program's build information.
func Get() Info {
	info := Info{Version: Version}
	if v := "v" + Version; !semver.IsValid(v) || semver.Canonical(v) != v {
		// A malformed -X value must not reach Helm, which refuses a
		// chart whose version is not SemVer, half-way through an upgrade.
		info.Version = "0.0.0-invalid"
	}
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return info
	}
	info.GoVersion = bi.GoVersion
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			info.Commit = s.Value
		case "vcs.time":
			info.CommitTime = s.Value
		case "vcs.modified":
			info.Modified = s.Value == "true"
		}
	}
	return info
}

// String is the version with the short commit, as "0.2.0 (6459f67)", and
// "-dirty" after a commit with uncommitted changes.
func (i Info) String() string {
	if i.Commit == "" {
		return i.Version
	}
	c := i.Commit
	if len(c) > 12 {
		c = c[:12]
	}
	if i.Modified {
		c += "-dirty"
	}
	return i.Version + " (" + strings.TrimSpace(c) + ")"
}
