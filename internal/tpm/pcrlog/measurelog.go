// Package pcrlog keeps the userspace measurement log: an append-only
// record of every PCR extend Orrery's own code makes (initrd phase markers,
// the node lock's cluster ID), so that a verifier can replay it against the
// PCR values a TPM quote reports.
//
// The firmware keeps its own TCG event log for what it and the boot loader
// measure; this log continues where that one ends. The log lives under /run
// on a node: it describes PCR values that last until the next reboot, and so
// must itself last exactly that long.
package pcrlog

import (
	"bufio"
	"bytes"
	"crypto"
	_ "crypto/sha1" //nolint:gosec // SHA-1 PCR banks exist on most TPMs and are extended too; nothing trusts them
	_ "crypto/sha256"
	_ "crypto/sha512"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"syscall"
)

// DefaultPath is where a node keeps its log.
const DefaultPath = "/run/orrery/measurements.log"

// Limits for parsing a log received from an untrusted peer.
const (
	MaxEntries        = 4096
	MaxDescriptionLen = 1024
	maxLineLen        = 16 << 10
)

// Entry records one extend of one PCR. Digests holds, for every PCR bank
// that was extended, the digest extended into it (the hash of the measured
// data in that bank's algorithm), keyed by algorithm name ("sha256", ...).
type Entry struct {
	PCR         uint32            `json:"pcr"`
	Digests     map[string]string `json:"digests"`
	Description string            `json:"description"`
}

// Algorithms maps the digest names used in the log to hash functions.
var Algorithms = map[string]crypto.Hash{
	"sha1":   crypto.SHA1,
	"sha256": crypto.SHA256,
	"sha384": crypto.SHA384,
	"sha512": crypto.SHA512,
}

// AlgorithmName returns the log's name for h, or "" if the log does not use it.
func AlgorithmName(h crypto.Hash) string {
	for name, alg := range Algorithms {
		if alg == h {
			return name
		}
	}
	return ""
}

// Digest returns the entry's digest for h, or nil if that bank was not extended.
func (e Entry) Digest(h crypto.Hash) []byte {
	s, ok := e.Digests[AlgorithmName(h)]
	if !ok {
		return nil
	}
	d, err := hex.DecodeString(s)
	if err != nil {
		return nil
	}
	return d
}

// Validate checks an entry from an untrusted source.
func (e Entry) Validate() error {
	if e.PCR > 23 {
		return fmt.Errorf("PCR %d out of range 0-23", e.PCR)
	}
	if len(e.Description) > MaxDescriptionLen {
		return fmt.Errorf("PCR %d: description longer than %d bytes", e.PCR, MaxDescriptionLen)
	}
	if len(e.Digests) == 0 {
		return fmt.Errorf("PCR %d (%q): no digests", e.PCR, e.Description)
	}
	for name, s := range e.Digests {
		alg, ok := Algorithms[name]
		if !ok {
			return fmt.Errorf("PCR %d (%q): unknown digest algorithm %q", e.PCR, e.Description, name)
		}
		d, err := hex.DecodeString(s)
		if err != nil {
			return fmt.Errorf("PCR %d (%q): %s digest is not hex: %w", e.PCR, e.Description, name, err)
		}
		if len(d) != alg.Size() {
			return fmt.Errorf("PCR %d (%q): %s digest has %d bytes, want %d", e.PCR, e.Description, name, len(d), alg.Size())
		}
	}
	return nil
}

// NewEntry describes a measurement of data into pcr, with a digest for each
// of the given hash algorithms.
func NewEntry(pcr uint32, data []byte, description string, algs ...crypto.Hash) Entry {
	e := Entry{PCR: pcr, Digests: map[string]string{}, Description: description}
	for _, h := range algs {
		hh := h.New()
		hh.Write(data)
		e.Digests[AlgorithmName(h)] = hex.EncodeToString(hh.Sum(nil))
	}
	return e
}

// Log is a measurement log file. Appends hold an exclusive lock on the file,
// readers through Snapshot a shared one, so a reader never sees half an
// entry and, with the extend done under the same lock, never sees the log
// and the PCRs disagree.
type Log struct {
	Path string
}

// withLock runs fn while holding a flock of the given kind on the log file,
// creating the file (and its directory) if needed.
func (l *Log) withLock(how int, fn func(f *os.File) error) error {
	if err := os.MkdirAll(filepath.Dir(l.Path), 0o755); err != nil {
		return fmt.Errorf("create measurement log directory: %w", err)
	}
	f, err := os.OpenFile(l.Path, os.O_RDWR|os.O_APPEND|os.O_CREATE, 0o644)
	if err != nil {
		return fmt.Errorf("open measurement log: %w", err)
	}
	defer f.Close()
	if err := syscall.Flock(int(f.Fd()), how); err != nil {
		return fmt.Errorf("lock measurement log: %w", err)
	}
	defer func() { _ = syscall.Flock(int(f.Fd()), syscall.LOCK_UN) }() // closing f unlocks it too
	return fn(f)
}

// Record runs extend (the TPM extend) and then appends e, both under the
// log's exclusive lock. If extend fails nothing is appended.
func (l *Log) Record(e Entry, extend func() error) error {
	if err := e.Validate(); err != nil {
		return fmt.Errorf("invalid measurement log entry: %w", err)
	}
	line, err := json.Marshal(e)
	if err != nil {
		return fmt.Errorf("encode measurement log entry: %w", err)
	}
	return l.withLock(syscall.LOCK_EX, func(f *os.File) error {
		if err := extend(); err != nil {
			return err
		}
		if _, err := f.Write(append(line, '\n')); err != nil {
			return fmt.Errorf("append to measurement log (the PCR was extended; attestation will fail until reboot): %w", err)
		}
		return nil
	})
}

// Snapshot runs fn (typically a TPM quote) under the log's shared lock and
// returns the log's raw contents as they were while fn ran. A log that does
// not exist yet reads as empty.
//
// An existing log is only opened for reading (a shared flock needs no
// more), so that a reader that must not change the log can have it on a
// read-only mount: the join service's pod quotes on its control-plane
// node that way.
func (l *Log) Snapshot(fn func() error) ([]byte, error) {
	f, err := os.Open(l.Path)
	if errors.Is(err, fs.ErrNotExist) {
		return l.snapshotNew(fn)
	}
	if err != nil {
		return nil, fmt.Errorf("open measurement log: %w", err)
	}
	defer f.Close()
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_SH); err != nil {
		return nil, fmt.Errorf("lock measurement log: %w", err)
	}
	defer func() { _ = syscall.Flock(int(f.Fd()), syscall.LOCK_UN) }() // closing f unlocks it too
	if err := fn(); err != nil {
		return nil, err
	}
	raw, err := io.ReadAll(f)
	if err != nil {
		return nil, fmt.Errorf("read measurement log: %w", err)
	}
	return raw, nil
}

// snapshotNew is Snapshot for a log that did not exist when it looked: it
// creates the log, so that the lock orders fn against a first Record.
func (l *Log) snapshotNew(fn func() error) ([]byte, error) {
	var raw []byte
	err := l.withLock(syscall.LOCK_SH, func(f *os.File) error {
		if err := fn(); err != nil {
			return err
		}
		var err error
		raw, err = os.ReadFile(l.Path)
		return err
	})
	return raw, err
}

// Read returns the entries of the log at path; a missing log has none.
func Read(path string) ([]Entry, error) {
	raw, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read measurement log: %w", err)
	}
	return Parse(raw)
}

// Parse decodes a log (one JSON entry per line) from an untrusted source.
func Parse(raw []byte) ([]Entry, error) {
	var entries []Entry
	sc := bufio.NewScanner(bytes.NewReader(raw))
	sc.Buffer(make([]byte, 0, 4096), maxLineLen)
	for n := 1; sc.Scan(); n++ {
		if len(entries) == MaxEntries {
			return nil, fmt.Errorf("measurement log has more than %d entries", MaxEntries)
		}
		dec := json.NewDecoder(bytes.NewReader(sc.Bytes()))
		dec.DisallowUnknownFields()
		var e Entry
		if err := dec.Decode(&e); err != nil {
			return nil, fmt.Errorf("measurement log line %d: %w", n, err)
		}
		if dec.More() {
			return nil, fmt.Errorf("measurement log line %d: trailing data after entry", n)
		}
		if err := e.Validate(); err != nil {
			return nil, fmt.Errorf("measurement log line %d: %w", n, err)
		}
		entries = append(entries, e)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("measurement log: %w", err)
	}
	if len(raw) > 0 && raw[len(raw)-1] != '\n' {
		return nil, errors.New("measurement log is truncated: last line has no newline")
	}
	return entries, nil
}

// Replay extends the PCR values in start (missing PCRs start at zero) with
// every entry's digest for h, in order, and returns the resulting values for
// all PCRs in start or in the log. An entry without a digest for h is an
// error: the bank would have been extended with something the log does not
// say.
func Replay(entries []Entry, h crypto.Hash, start map[uint32][]byte) (map[uint32][]byte, error) {
	pcrs := make(map[uint32][]byte, len(start))
	for i, v := range start {
		pcrs[i] = bytes.Clone(v)
	}
	for n, e := range entries {
		d := e.Digest(h)
		if len(d) != h.Size() {
			return nil, fmt.Errorf("measurement log entry %d (PCR %d, %q) has no %s digest", n+1, e.PCR, e.Description, AlgorithmName(h))
		}
		pcrs[e.PCR] = Extend(h, pcrs[e.PCR], d)
	}
	return pcrs, nil
}

// Extend returns the value of a PCR of bank h after extending cur (nil means
// a freshly reset PCR, all zeros) with digest: h(cur || digest).
func Extend(h crypto.Hash, cur, digest []byte) []byte {
	if cur == nil {
		cur = make([]byte, h.Size())
	}
	hh := h.New()
	hh.Write(cur)
	hh.Write(digest)
	return hh.Sum(nil)
}

// Describe lists the descriptions of the entries that extended pcr, oldest
// first: what a verifier names when that PCR does not match.
func Describe(entries []Entry, pcr uint32) []string {
	var out []string
	for _, e := range entries {
		if e.PCR == pcr {
			out = append(out, e.Description)
		}
	}
	return out
}

// PCRs lists the PCR indexes that entries extend, sorted.
func PCRs(entries []Entry) []uint32 {
	seen := map[uint32]bool{}
	var out []uint32
	for _, e := range entries {
		if !seen[e.PCR] {
			seen[e.PCR] = true
			out = append(out, e.PCR)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i] < out[j] })
	return out
}
