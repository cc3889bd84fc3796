package versions

import (
	"errors"
	"fmt"
)

// Upgrade errors, which CheckUpgrade wraps with the two versions.
var (
	// ErrDowngrade refuses going to an older version: kubeadm cannot,
	// and etcd's data, once written by a newer etcd, may not be read
	// by an older one.
	ErrDowngrade = errors.New("no downgrades: Kubernetes cannot be downgraded")
	// ErrSkipsMinor refuses going more than one minor at once:
	// Kubernetes' skew policy lets a control plane move one minor at a
	// time, so that its components and kubelets are never two apart.
	ErrSkipsMinor = errors.New("an upgrade moves Kubernetes one minor version at a time")
)

// CheckUpgrade returns nil if a cluster at version from may be upgraded
// to version to: a newer patch of the same minor, or any patch of the
// next minor. The same version is allowed too: an upgrade that was
// interrupted goes on. Both must be vMAJOR.MINOR.PATCH.
func CheckUpgrade(from, to string) error {
	pf, pt := parts(from), parts(to)
	if pf[0] < 0 {
		return fmt.Errorf("%q is not a Kubernetes version (vMAJOR.MINOR.PATCH)", from)
	}
	if pt[0] < 0 {
		return fmt.Errorf("%q is not a Kubernetes version (vMAJOR.MINOR.PATCH)", to)
	}
	switch {
	case Compare(to, from) < 0:
		return fmt.Errorf("%w: the cluster runs %s, and %s is older", ErrDowngrade, from, to)
	case pt[0] != pf[0] || pt[1] > pf[1]+1:
		return fmt.Errorf("%w: the cluster runs %s, so the next step is a patch of v%d.%d, not %s", ErrSkipsMinor, from, pf[0], pf[1]+1, to)
	}
	return nil
}

// UpgradesFrom lists the versions the image carries to which a cluster at
// version from may be upgraded, oldest first; none if it is current.
func UpgradesFrom(from string) []string {
	var out []string
	for _, v := range List() {
		if Compare(v, from) > 0 && CheckUpgrade(from, v) == nil {
			out = append(out, v)
		}
	}
	return out
}
