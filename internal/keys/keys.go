// Package keys holds a cluster's master secret and derives every other key
// from it.
//
// The master secret (32 random bytes and a 32-byte salt) is made by the
// owner's CLI and handed to the first control-plane node at init. All
// derived keys use HKDF-SHA256 with the master key as secret, the master
// salt as salt, and a purpose-specific info string, so one secret yields
// independent keys for every purpose. The cluster ID is the exception: it
// is derived from the measurement secret and a separate measurement salt
// (see ClusterID).
//
// The derivations are part of the cluster's on-disk and on-wire contract:
// changing an info string or the way it is built makes every existing
// state disk unreadable. Known-answer tests pin them.
package keys

import (
	"crypto/ed25519"
	"crypto/hkdf"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
)

// Sizes of the master secret's parts and of the fixed-size derived keys.
const (
	// KeySize is the size of the master key in bytes.
	KeySize = 32
	// SaltSize is the size of the master salt and of the measurement salt.
	SaltSize = 32
	// DiskKeySize is the size of a state-disk key.
	DiskKeySize = 32
	// MinKeyLength and MaxKeyLength bound the length of a data key. Below
	// 16 bytes a key is too weak for any cipher we use; above 64 nobody
	// needs it and it only hides a caller's mistake.
	MinKeyLength = 16
	MaxKeyLength = 64
)

// HKDF info strings. The "orrery/v1/" prefix separates our derivations from
// any other use of the same secret and leaves room for a v2 scheme. Data
// keys get the key ID appended to InfoDataKeyPrefix; no key ID can turn a
// data-key info string into one of the others because none of them starts
// with that prefix.
const (
	// InfoDataKeyPrefix is followed by the key ID of a data key.
	InfoDataKeyPrefix = "orrery/v1/data-key/"
	// InfoMeasurementSecret derives the measurement secret.
	InfoMeasurementSecret = "orrery/v1/measurement-secret" //nolint:gosec // an HKDF label, not a secret
	// InfoClusterID derives the cluster ID from the measurement secret.
	InfoClusterID = "orrery/v1/cluster-id"
	// InfoOwnerAccessKey derives the seed of the owner's access key.
	InfoOwnerAccessKey = "orrery/v1/owner-access-key"
)

// diskKeyIDPrefix binds a disk key to a disk UUID within the data-key space,
// so the key service can hand out disk keys through the generic data-key
// call.
const diskKeyIDPrefix = "disk:"

// MasterSecret is the root of all of a cluster's keys. Whoever holds it can
// open every state disk of the cluster, so it only travels over attested
// TLS and is stored by the owner in a 0600 file.
type MasterSecret struct {
	Key  []byte `json:"key"`
	Salt []byte `json:"salt"`
}

// GenerateMasterSecret reads a fresh master secret from r, which should be
// crypto/rand.Reader outside tests.
func GenerateMasterSecret(r io.Reader) (MasterSecret, error) {
	key, err := readRandom(r, KeySize)
	if err != nil {
		return MasterSecret{}, fmt.Errorf("generate master key: %w", err)
	}
	salt, err := readRandom(r, SaltSize)
	if err != nil {
		return MasterSecret{}, fmt.Errorf("generate master salt: %w", err)
	}
	return MasterSecret{Key: key, Salt: salt}, nil
}

// GenerateSalt reads a fresh measurement salt from r, which should be
// crypto/rand.Reader outside tests.
func GenerateSalt(r io.Reader) ([]byte, error) {
	salt, err := readRandom(r, SaltSize)
	if err != nil {
		return nil, fmt.Errorf("generate measurement salt: %w", err)
	}
	return salt, nil
}

func readRandom(r io.Reader, n int) ([]byte, error) {
	if r == nil {
		return nil, errors.New("no random source")
	}
	b := make([]byte, n)
	if _, err := io.ReadFull(r, b); err != nil {
		return nil, fmt.Errorf("read random bytes: %w", err)
	}
	return b, nil
}

// Validate reports whether ms has a key and a salt of the right sizes.
func (ms MasterSecret) Validate() error {
	if len(ms.Key) != KeySize {
		return fmt.Errorf("master key has %d bytes, want %d", len(ms.Key), KeySize)
	}
	if len(ms.Salt) != SaltSize {
		return fmt.Errorf("master salt has %d bytes, want %d", len(ms.Salt), SaltSize)
	}
	return nil
}

// DeriveKey derives a data key of length bytes for keyID. The same ID and
// length always give the same key. Keys of different lengths for one ID
// are prefixes of each other (a property of HKDF), so a key ID should be
// used with a single length.
func (ms MasterSecret) DeriveKey(keyID string, length int) ([]byte, error) {
	if err := ms.Validate(); err != nil {
		return nil, fmt.Errorf("derive data key: %w", err)
	}
	if keyID == "" {
		return nil, errors.New("derive data key: key ID is empty")
	}
	if length < MinKeyLength || length > MaxKeyLength {
		return nil, fmt.Errorf("derive data key %q: length %d is out of range: must be %d to %d bytes",
			keyID, length, MinKeyLength, MaxKeyLength)
	}
	return derive(ms.Key, ms.Salt, InfoDataKeyPrefix+keyID, length)
}

// DiskKeyID returns the data-key ID of the state disk with the given UUID,
// as the join service passes it to the key service. The UUID is
// canonicalised to lower case because tools disagree on the case they
// print, and a disk must get the same key whichever tool read its UUID.
func DiskKeyID(diskUUID string) (string, error) {
	u, err := canonicalUUID(diskUUID)
	if err != nil {
		return "", err
	}
	return diskKeyIDPrefix + u, nil
}

// DiskKey derives the 32-byte key of the state disk with the given UUID.
// It equals DeriveKey(DiskKeyID(diskUUID), DiskKeySize).
func (ms MasterSecret) DiskKey(diskUUID string) ([]byte, error) {
	id, err := DiskKeyID(diskUUID)
	if err != nil {
		return nil, fmt.Errorf("derive disk key: %w", err)
	}
	return ms.DeriveKey(id, DiskKeySize)
}

// MeasurementSecret derives the 32-byte measurement secret, which every
// node receives so it can compute the cluster ID (see ClusterID).
func (ms MasterSecret) MeasurementSecret() ([]byte, error) {
	if err := ms.Validate(); err != nil {
		return nil, fmt.Errorf("derive measurement secret: %w", err)
	}
	return derive(ms.Key, ms.Salt, InfoMeasurementSecret, 32)
}

// ClusterID derives the 32-byte cluster ID that nodes extend into PCR 15.
//
// It uses the separate measurement salt, never the master salt: every
// joining node receives only the measurement secret and the measurement
// salt, and must arrive at the same ID as the first node without ever
// learning the master salt (which, with the master key, would let it
// derive every disk key).
func ClusterID(measurementSecret, measurementSalt []byte) ([]byte, error) {
	if len(measurementSecret) != 32 {
		return nil, fmt.Errorf("derive cluster ID: measurement secret has %d bytes, want 32", len(measurementSecret))
	}
	if len(measurementSalt) != SaltSize {
		return nil, fmt.Errorf("derive cluster ID: measurement salt has %d bytes, want %d", len(measurementSalt), SaltSize)
	}
	return derive(measurementSecret, measurementSalt, InfoClusterID, 32)
}

// OwnerAccessKey derives the Ed25519 key with which the owner reads a
// running node (its journal, its units, a fresh attestation). Nodes hold
// only its public half, so a node, or root on one, cannot act as the
// owner towards another node; only a holder of the master secret can.
func (ms MasterSecret) OwnerAccessKey() (ed25519.PrivateKey, error) {
	if err := ms.Validate(); err != nil {
		return nil, fmt.Errorf("derive owner access key: %w", err)
	}
	seed, err := derive(ms.Key, ms.Salt, InfoOwnerAccessKey, ed25519.SeedSize)
	if err != nil {
		return nil, err
	}
	return ed25519.NewKeyFromSeed(seed), nil
}

// derive is the only place that calls HKDF, so the RFC 5869 vectors in the
// tests cover exactly the code every derivation runs.
func derive(secret, salt []byte, info string, length int) ([]byte, error) {
	k, err := hkdf.Key(sha256.New, secret, salt, info, length)
	if err != nil {
		return nil, fmt.Errorf("hkdf-sha256: %w", err)
	}
	return k, nil
}

// canonicalUUID checks the 8-4-4-4-12 hex form and lower-cases it.
func canonicalUUID(s string) (string, error) {
	if s == "" {
		return "", errors.New("disk UUID is empty")
	}
	malformed := func() error {
		return fmt.Errorf("disk UUID %q is malformed: want 8-4-4-4-12 hex digits such as 0b5c1f3e-8d2a-4c6b-9e7f-1a2b3c4d5e6f", s)
	}
	if len(s) != 36 {
		return "", malformed()
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch i {
		case 8, 13, 18, 23:
			if c != '-' {
				return "", malformed()
			}
		default:
			if !isHex(c) {
				return "", malformed()
			}
		}
	}
	u := strings.ToLower(s)
	// A disk reporting the nil UUID has not been formatted the way we
	// expect; if several did, they would all share one key.
	if u == "00000000-0000-0000-0000-000000000000" {
		return "", errors.New("disk UUID is the nil UUID: the state disk was not formatted with a random UUID")
	}
	return u, nil
}

func isHex(c byte) bool {
	return '0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F'
}

// String keeps the secret out of logs and error messages that format a
// MasterSecret with %v or %s.
func (ms MasterSecret) String() string { return "MasterSecret{REDACTED}" }

// GoString does the same for %#v.
func (ms MasterSecret) GoString() string { return ms.String() }

// LogValue does the same for log/slog, whose JSON handler would otherwise
// marshal the key and salt.
func (ms MasterSecret) LogValue() slog.Value { return slog.StringValue(ms.String()) }
