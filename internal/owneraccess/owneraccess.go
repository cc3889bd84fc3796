// Package owneraccess is the owner's access key as a node sees it: where
// the node keeps its public half, and the rule that admits a caller to
// the inspect service (internal/inspectserver): it proves that key. The key is
// derived from the master secret (keys.MasterSecret.OwnerAccessKey), so
// only a holder of the master secret has its private half; nodes get the
// public half at init (from the master secret) or in their join ticket.
package owneraccess

import (
	"bytes"
	"crypto"
	"crypto/ed25519"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/orrery-dev/orrery/internal/atomicfile"
)

// Path is where a node keeps the public half of its owner's access
// key, on the state disk: bootstrapperd writes it when the node joins a
// cluster (from the join ticket) or initialises one (from the master
// secret). Not under /var/lib/orrery, which is root's alone: the node
// service reads it as its own user.
const Path = "/var/lib/orrery-owner/access-key.pem"

const pemType = "ORRERY OWNER ACCESS KEY"

// Write stores key at path (world-readable: it is public, and the
// inspect service runs as its own user).
func Write(path string, key ed25519.PublicKey) error {
	if len(key) != ed25519.PublicKeySize {
		return fmt.Errorf("owner access key has %d bytes, want %d", len(key), ed25519.PublicKeySize)
	}
	// atomicfile would make a missing directory root's alone, and a
	// writer's umask (bootstrapperd's is 0077) would too: the mode is set,
	// not asked for.
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	if err := os.Chmod(dir, 0o755); err != nil {
		return err
	}
	return atomicfile.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: pemType, Bytes: key}), 0o644)
}

// Read reads the key Write stored.
func Read(path string) (ed25519.PublicKey, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read the owner's access key: %w (a node learns it when it initialises or joins a cluster)", err)
	}
	b, _ := pem.Decode(raw)
	if b == nil || b.Type != pemType || len(b.Bytes) != ed25519.PublicKeySize {
		return nil, fmt.Errorf("%s holds no %s block of %d bytes", path, pemType, ed25519.PublicKeySize)
	}
	return ed25519.PublicKey(b.Bytes), nil
}

// HeaderField encodes key for the state disk's LUKS2 header (its subsystem
// field, 47 bytes at most): unpadded base64url, 43 bytes. The initrd reads
// it there, before the disk is open. The header is not authenticated:
// whoever holds the disk could put another key there, and would learn
// what the initrd serves its owner, the lines its console shows anyway.
func HeaderField(key ed25519.PublicKey) string { return base64.RawURLEncoding.EncodeToString(key) }

// FromHeaderField decodes a HeaderField.
func FromHeaderField(s string) (ed25519.PublicKey, error) {
	k, err := base64.RawURLEncoding.DecodeString(s)
	if err != nil || len(k) != ed25519.PublicKeySize {
		return nil, fmt.Errorf("the state disk's header names no owner access key (subsystem %q)", truncateField(s))
	}
	return ed25519.PublicKey(k), nil
}

func truncateField(s string) string {
	if len(s) > 64 {
		return s[:64] + "..."
	}
	return s
}

// ErrNotOwner refuses a caller that did not prove the owner's key.
var ErrNotOwner = errors.New("this node answers only its owner, who proves the access key derived from the cluster's master secret (orrery uses it by itself when it finds the master secret in its workspace)")

// Authorize returns an atls.Config.AuthorizeClient that admits only a
// client proving the key owner returns. owner is asked each time: a node
// learns its owner's key when it joins, long after the service started.
func Authorize(owner func() (ed25519.PublicKey, error)) func(crypto.PublicKey) error {
	return func(k crypto.PublicKey) error {
		want, err := owner()
		if err != nil {
			return fmt.Errorf("%w, and this node does not know its owner yet: %v", ErrNotOwner, err)
		}
		if got, ok := k.(ed25519.PublicKey); ok && bytes.Equal(got, want) {
			return nil
		}
		return fmt.Errorf("%w; the client proved key %s", ErrNotOwner, Fingerprint(k))
	}
}

// FromFile returns a source of the owner's key for Authorize that reads
// it from path each time.
func FromFile(path string) func() (ed25519.PublicKey, error) {
	return func() (ed25519.PublicKey, error) { return Read(path) }
}

// Fingerprint names a public key in logs: the first bytes of the SHA-256
// of its raw form (an Ed25519 key) or of its type.
func Fingerprint(k crypto.PublicKey) string {
	if e, ok := k.(ed25519.PublicKey); ok {
		d := sha256.Sum256(e)
		return "ed25519:" + hex.EncodeToString(d[:8])
	}
	return fmt.Sprintf("%T", k)
}
