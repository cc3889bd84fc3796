package keys

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"runtime"
)

// maxFileSize bounds what ReadMasterSecretFile reads. A real file is about
// 110 bytes; anything near this limit is the wrong file.
const maxFileSize = 64 << 10

// WriteMasterSecretFile stores ms as JSON in a new file at path, readable by
// the owner only. The file appears complete or not at all: it is written to
// a temporary file in the same directory, synced, and then moved into
// place. An existing file is never replaced, because it may hold the only
// copy of another cluster's master secret; the error then wraps
// fs.ErrExist.
func WriteMasterSecretFile(path string, ms MasterSecret) error {
	if err := ms.Validate(); err != nil {
		return fmt.Errorf("write master secret file %s: %w", path, err)
	}
	if err := checkAbsent(path); err != nil {
		return err
	}
	data, err := json.MarshalIndent(ms, "", "  ")
	if err != nil {
		return fmt.Errorf("encode master secret: %w", err)
	}
	data = append(data, '\n')

	dir := filepath.Dir(path)
	// CreateTemp makes the file with mode 0600, so the secret is never
	// readable by others, not even before the final name exists.
	tmp, err := os.CreateTemp(dir, "."+filepath.Base(path)+".tmp*")
	if err != nil {
		return fmt.Errorf("write master secret file: %w", err)
	}
	tmpName := tmp.Name()
	// Removes the temporary file on every error path; harmless after
	// success, when the name is already gone.
	defer os.Remove(tmpName)
	if _, err := tmp.Write(data); err != nil {
		tmp.Close()
		return fmt.Errorf("write master secret file: %w", err)
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return fmt.Errorf("write master secret file: %w", err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("write master secret file: %w", err)
	}

	if err := placeNoReplace(tmpName, path); err != nil {
		return err
	}
	// After a hard link the temporary name still points at the secret; drop
	// it before syncing so a crash does not leave a second copy behind.
	if err := os.Remove(tmpName); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("remove temporary master secret file: %w", err)
	}
	if err := syncDir(dir); err != nil {
		return fmt.Errorf("master secret file %s was written, but syncing its directory failed, so it may not survive a crash: %w", path, err)
	}
	return nil
}

// linkFile is os.Link; tests replace it to reach the fallback for
// filesystems without hard links.
var linkFile = os.Link

// placeNoReplace gives the temporary file its final name without ever
// replacing a file that appeared since checkAbsent.
func placeNoReplace(tmpName, path string) error {
	// A hard link fails if the target exists, which closes the race that
	// checking and then renaming would leave open.
	err := linkFile(tmpName, path)
	if err == nil {
		return nil
	}
	if errors.Is(err, fs.ErrExist) {
		return existsError(path)
	}
	// Some filesystems (FAT on a USB stick, some network shares) have no
	// hard links. The owner may well keep the secret on such a stick, so
	// fall back to check-then-rename and accept the narrow race.
	if err := checkAbsent(path); err != nil {
		return err
	}
	if err := os.Rename(tmpName, path); err != nil {
		return fmt.Errorf("write master secret file: %w", err)
	}
	return nil
}

func checkAbsent(path string) error {
	_, err := os.Lstat(path)
	switch {
	case err == nil:
		return existsError(path)
	case errors.Is(err, fs.ErrNotExist):
		return nil
	default:
		return fmt.Errorf("write master secret file: %w", err)
	}
}

func existsError(path string) error {
	return fmt.Errorf("master secret file %s already exists; overwriting it would lose the keys of the cluster it belongs to: move it away or choose another path: %w",
		path, fs.ErrExist)
}

func syncDir(dir string) error {
	// Windows cannot open a directory for syncing, and NTFS makes the
	// rename durable without it.
	if runtime.GOOS == "windows" {
		return nil
	}
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}

// ReadMasterSecretFile reads a file written by WriteMasterSecretFile. It
// refuses a file that other users may access, since they could read the
// secret too, and a file that is not exactly a master secret.
func ReadMasterSecretFile(path string) (MasterSecret, error) {
	f, err := os.Open(path)
	if err != nil {
		return MasterSecret{}, fmt.Errorf("read master secret file: %w", err)
	}
	defer f.Close()

	fi, err := f.Stat()
	if err != nil {
		return MasterSecret{}, fmt.Errorf("read master secret file: %w", err)
	}
	if !fi.Mode().IsRegular() {
		return MasterSecret{}, fmt.Errorf("master secret file %s is not a regular file", path)
	}
	// Windows has no Unix permission bits; Go reports 0666 for every
	// writable file there.
	if perm := fi.Mode().Perm(); runtime.GOOS != "windows" && perm&0o077 != 0 {
		how := "readable"
		if perm&0o044 == 0 {
			how = "accessible"
		}
		return MasterSecret{}, fmt.Errorf("master secret file %s is %s by others (mode %04o): chmod 600 it", path, how, perm)
	}

	data, err := io.ReadAll(io.LimitReader(f, maxFileSize+1))
	if err != nil {
		return MasterSecret{}, fmt.Errorf("read master secret file: %w", err)
	}
	if len(data) > maxFileSize {
		return MasterSecret{}, fmt.Errorf("master secret file %s is larger than %d bytes: it is not a master secret file", path, maxFileSize)
	}
	ms, err := parseMasterSecret(data)
	if err != nil {
		return MasterSecret{}, fmt.Errorf("master secret file %s: %w", path, err)
	}
	return ms, nil
}

func parseMasterSecret(data []byte) (MasterSecret, error) {
	if len(bytes.TrimSpace(data)) == 0 {
		return MasterSecret{}, errors.New("file is empty")
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	var ms MasterSecret
	if err := dec.Decode(&ms); err != nil {
		return MasterSecret{}, fmt.Errorf("not a valid master secret (truncated or corrupted?): %w", err)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return MasterSecret{}, errors.New("not a valid master secret: unexpected data after the JSON object")
	}
	if err := ms.Validate(); err != nil {
		return MasterSecret{}, err
	}
	return ms, nil
}
