// Package tarfiles reads a gzip-compressed tar archive into memory, as
// tests read the support bundles the owner's commands and the nodes write.
package tarfiles

import (
	"archive/tar"
	"compress/gzip"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
)

// Read returns the regular files of the archive r, by name. It is for
// archives the caller trusts to fit in memory.
func Read(r io.Reader) (map[string]string, error) {
	gz, err := gzip.NewReader(r)
	if err != nil {
		return nil, err
	}
	tr := tar.NewReader(gz)
	files := map[string]string{}
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return files, nil
		}
		if err != nil {
			return nil, err
		}
		if h.Typeflag != tar.TypeReg {
			return nil, fmt.Errorf("%s is not a regular file", h.Name)
		}
		var b strings.Builder
		if _, err := io.Copy(&b, tr); err != nil { //nolint:gosec // archives the caller trusts to fit in memory (see Read)
			return nil, err
		}
		files[h.Name] = b.String()
	}
}

// Names lists the files' names, sorted, for a test's message.
func Names(files map[string]string) string {
	var names []string
	for n := range files {
		names = append(names, n)
	}
	slices.Sort(names)
	return strings.Join(names, ", ")
}
