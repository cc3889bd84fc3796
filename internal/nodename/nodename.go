// Package nodename checks the names a node may have: the lowercase RFC 1123
// subdomains Kubernetes accepts for nodes. It is written out rather than
// taken from k8s.io/apimachinery because the initrd's /init links the
// packages that use it and must not pull in Kubernetes' libraries.
package nodename

import "strings"

// Valid reports whether s is a name Kubernetes accepts for a node.
func Valid(s string) bool {
	if s == "" || len(s) > 253 {
		return false
	}
	for label := range strings.SplitSeq(s, ".") {
		if label == "" || len(label) > 63 || label[0] == '-' || label[len(label)-1] == '-' {
			return false
		}
		for _, r := range label {
			if !(r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r == '-') {
				return false
			}
		}
	}
	return true
}
