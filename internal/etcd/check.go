package etcd

import (
	"bytes"
	"crypto/sha256"
	"errors"
	"hash"
	"io"
)

// Writer writes a snapshot as it streams in, and checks at Close that it
// ends with the SHA-256 of what came before, as etcd ends each snapshot
// (and as 'etcdutl snapshot restore' checks it). What it writes to w is
// the whole stream, hash included: the file etcd's tools restore.
type Writer struct {
	w    io.Writer
	h    hash.Hash
	tail []byte // the last sha256.Size bytes seen, not yet hashed
	n    int64
}

// NewWriter writes to w.
func NewWriter(w io.Writer) *Writer { return &Writer{w: w, h: sha256.New()} }

// Write implements io.Writer.
func (s *Writer) Write(p []byte) (int, error) {
	n, err := s.w.Write(p)
	s.n += int64(n)
	s.tail = append(s.tail, p[:n]...)
	if over := len(s.tail) - sha256.Size; over > 0 {
		s.h.Write(s.tail[:over])
		s.tail = append(s.tail[:0], s.tail[over:]...)
	}
	return n, err
}

// Size is how many bytes were written.
func (s *Writer) Size() int64 { return s.n }

// ErrCorrupt means a snapshot does not end with its database's SHA-256:
// it was cut short or changed on its way.
var ErrCorrupt = errors.New("the etcd snapshot does not end with the SHA-256 of its database: it is cut short or corrupt")

// Check reports whether what was written is a whole snapshot.
func (s *Writer) Check() error {
	if len(s.tail) < sha256.Size || !bytes.Equal(s.h.Sum(nil), s.tail) {
		return ErrCorrupt
	}
	return nil
}
