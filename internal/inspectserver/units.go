package inspectserver

import (
	"fmt"
	"path"
	"strings"
)

// CheckPattern refuses a unit pattern that is not a glob over unit names.
func CheckPattern(p string) error {
	if p == "" {
		return nil
	}
	if len(p) > 255 {
		return fmt.Errorf("unit pattern has %d bytes, at most 255", len(p))
	}
	if _, err := path.Match(p, ""); err != nil {
		return fmt.Errorf("unit pattern %q: %w", truncate(p, 64), err)
	}
	for _, r := range p {
		if !(r == '*' || r == '?' || r == '[' || r == ']' || r == '!' || strings.ContainsRune(":-_.\\@", r) ||
			'a' <= r && r <= 'z' || 'A' <= r && r <= 'Z' || '0' <= r && r <= '9') {
			return fmt.Errorf("unit pattern %q holds %q: use letters, digits, \":-_.\\@\" and the wildcards *, ?, [...]", truncate(p, 64), r)
		}
	}
	return nil
}
