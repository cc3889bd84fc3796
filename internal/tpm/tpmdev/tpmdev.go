// Package tpmdev opens a node's TPM. Everything that talks to the TPM takes
// an opener function instead of a path, so tests can hand it swtpm.
package tpmdev

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
)

// Paths tried in order: the kernel's resource manager first, which lets
// several processes use the TPM at once and flushes what a process leaves.
var Paths = []string{"/dev/tpmrm0", "/dev/tpm0"}

// Opener opens a TPM: Open on a node, a swtpm instance's Open in tests.
// Each caller closes what it opened, so that the kernel's resource manager
// flushes the handles it left.
type Opener func() (io.ReadWriteCloser, error)

// Open opens the node's TPM.
func Open() (io.ReadWriteCloser, error) {
	var errs []error
	for _, p := range Paths {
		f, err := os.OpenFile(p, os.O_RDWR, 0)
		if err == nil {
			return f, nil
		}
		if !errors.Is(err, fs.ErrNotExist) {
			return nil, fmt.Errorf("open TPM %s: %w", p, err)
		}
		errs = append(errs, err)
	}
	return nil, fmt.Errorf("no TPM device (%w): the VM needs a vTPM", errors.Join(errs...))
}
