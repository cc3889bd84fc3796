// Package atomicfile writes a file so that a crash or power cut leaves
// either the old content or the new, never a truncated mix: the data goes
// to a temporary file beside the target, is synced, and renamed over it.
package atomicfile

import (
	"errors"
	"os"
	"path/filepath"
)

// WriteFile writes data to path with mode perm, atomically, creating the
// parent directory (mode 0700) if needed.
func WriteFile(path string, data []byte, perm os.FileMode) error {
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	f, err := os.CreateTemp(dir, "."+filepath.Base(path)+".tmp-")
	if err != nil {
		return err
	}
	tmp := f.Name()
	_, err = f.Write(data)
	if err == nil {
		err = f.Chmod(perm)
	}
	if err == nil {
		err = f.Sync()
	}
	err = errors.Join(err, f.Close())
	if err == nil {
		err = os.Rename(tmp, path)
	}
	if err != nil {
		os.Remove(tmp)
		return err
	}
	// The rename is durable once the directory is: a caller that relies
	// on it (a disk's generation) must hear that it is not.
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	return errors.Join(d.Sync(), d.Close())
}
