package handoff

import (
	"fmt"
	"os"

	"github.com/orrery-dev/orrery/internal/atomicfile"
	"github.com/orrery-dev/orrery/internal/versions"
)

// ClusterVersionFile is where the initrd leaves the Kubernetes version
// the cluster runs, as the join service's rejoin ticket said it, for
// bootstrapperd to run that release of the image. It lives on /run and
// vanishes with the boot: the node never keeps a version choice where
// root on the node could plant one.
const ClusterVersionFile = "/run/orrery/cluster-kubernetes-version"

// WriteClusterVersion records version, which the image must carry.
func WriteClusterVersion(path, version string) error {
	if _, err := versions.Get(version); err != nil {
		return fmt.Errorf("record the cluster's Kubernetes version: %w", err)
	}
	if err := atomicfile.WriteFile(path, []byte(version), 0o644); err != nil {
		return fmt.Errorf("record the cluster's Kubernetes version: %w", err)
	}
	return nil
}

// ReadClusterVersion reads what WriteClusterVersion wrote; os.ErrNotExist
// (wrapped) if the initrd wrote nothing this boot.
func ReadClusterVersion(path string) (string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "", fmt.Errorf("read the cluster's Kubernetes version: %w", err)
	}
	if _, err := versions.Get(string(b)); err != nil {
		return "", fmt.Errorf("read the cluster's Kubernetes version from %s: %w", path, err)
	}
	return string(b), nil
}
