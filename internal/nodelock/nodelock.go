// Package nodelock decides, once per boot and for good, which cluster a node
// belongs to. The first TryLock wins: it extends PCR 15 with the cluster ID,
// which no one can undo short of a reboot, and every attestation the node
// gives from then on shows it. Init and join race for the lock in
// bootstrapperd; the loser stops.
//
// The lock's state lives in the TPM, not in memory: a restarted daemon reads
// it back from PCR 15.
package nodelock

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"sync"

	"github.com/google/go-tpm/legacy/tpm2"

	"github.com/orrery-dev/orrery/internal/tpm/pcrlog"
	"github.com/orrery-dev/orrery/internal/tpm/tpmdev"
)

// PCR is the PCR the lock extends. It is zero at boot and no boot component
// measures into it.
const PCR = 15

// descriptionPrefix starts the measurement log's description of the
// lock's extend; the cluster ID in hex follows.
const descriptionPrefix = "node lock: cluster ID "

// Lock is the node lock.
type Lock struct {
	openTPM tpmdev.Opener
	mlog    *pcrlog.Log

	// mu orders TryLock calls within this process; the TPM's PCR 15 is the
	// source of truth across processes and restarts.
	mu sync.Mutex
}

// New returns the node lock. mlog records the extend for verifiers.
func New(openTPM tpmdev.Opener, mlog *pcrlog.Log) *Lock {
	return &Lock{openTPM: openTPM, mlog: mlog}
}

// TryLock locks the node to clusterID. It returns true if this call took
// the lock, false if the node was already locked (by this process, an
// earlier run of it, or anyone else since boot).
func (l *Lock) TryLock(clusterID []byte) (bool, error) {
	if len(clusterID) == 0 {
		return false, errors.New("node lock: empty cluster ID")
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	rw, err := l.openTPM()
	if err != nil {
		return false, fmt.Errorf("node lock: open TPM: %w", err)
	}
	defer rw.Close()
	v, err := readPCR(rw)
	if err != nil {
		return false, err
	}
	if !bytes.Equal(v, make([]byte, len(v))) {
		return false, nil
	}
	if err := l.mlog.Measure(rw, PCR, clusterID, descriptionPrefix+hex.EncodeToString(clusterID)); err != nil {
		return false, fmt.Errorf("node lock: %w", err)
	}
	return true, nil
}

// IsLocked reports whether the node is locked to a cluster since boot.
func (l *Lock) IsLocked() (bool, error) {
	v, err := l.readPCR()
	if err != nil {
		return false, err
	}
	return !bytes.Equal(v, make([]byte, len(v))), nil
}

// LockedTo reports whether the node is locked to exactly clusterID: PCR 15
// holds the one value a single TryLock(clusterID) after boot gives. A
// join that took the lock and then failed (kubeadm, a dropped ticket)
// uses it to tell its own earlier lock from someone else's.
func (l *Lock) LockedTo(clusterID []byte) (bool, error) {
	v, err := l.readPCR()
	if err != nil {
		return false, err
	}
	return bytes.Equal(v, Expected(clusterID)), nil
}

// Cluster returns the cluster ID the node is locked to, as the
// measurement log names it, checked against PCR 15: a log that does not
// replay to the PCR's value names nothing. It fails for a node that is not
// locked.
func (l *Lock) Cluster() ([]byte, error) {
	v, err := l.readPCR()
	if err != nil {
		return nil, err
	}
	raw, err := os.ReadFile(l.mlog.Path)
	if err != nil {
		return nil, fmt.Errorf("node lock: read the measurement log: %w", err)
	}
	entries, err := pcrlog.Parse(raw)
	if err != nil {
		return nil, fmt.Errorf("node lock: %w", err)
	}
	d := pcrlog.Describe(entries, PCR)
	if len(d) != 1 || !strings.HasPrefix(d[0], descriptionPrefix) {
		return nil, fmt.Errorf("node lock: the measurement log shows %d extends of PCR %d, not one by the node lock", len(d), PCR)
	}
	id, err := hex.DecodeString(strings.TrimPrefix(d[0], descriptionPrefix))
	if err != nil || !bytes.Equal(Expected(id), v) {
		return nil, fmt.Errorf("node lock: the measurement log's cluster ID does not match PCR %d", PCR)
	}
	return id, nil
}

func (l *Lock) readPCR() ([]byte, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	rw, err := l.openTPM()
	if err != nil {
		return nil, fmt.Errorf("node lock: open TPM: %w", err)
	}
	defer rw.Close()
	return readPCR(rw)
}

// Expected is PCR 15's SHA-256 value on a node locked to clusterID.
func Expected(clusterID []byte) []byte {
	data := sha256.Sum256(clusterID)
	pcr := sha256.Sum256(append(make([]byte, sha256.Size), data[:]...))
	return pcr[:]
}

func readPCR(rw io.ReadWriter) ([]byte, error) {
	v, err := tpm2.ReadPCR(rw, PCR, tpm2.AlgSHA256)
	if err != nil {
		return nil, fmt.Errorf("node lock: read PCR %d: %w", PCR, err)
	}
	return v, nil
}
