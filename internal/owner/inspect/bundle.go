package inspect

import (
	"archive/tar"
	"compress/gzip"
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/orrery-dev/orrery/internal/proto/inspectpb"
	"github.com/orrery-dev/orrery/internal/redact"
	"github.com/orrery-dev/orrery/internal/termtext"
)

// MaxNodeBundle bounds what the owner takes from one node's support
// bundle, uncompressed: the node bounds its own to 44 MiB, and a node that
// sends more is not the owner's node.
const MaxNodeBundle = 64 << 20

// Bundle is a support bundle being written: a gzip-compressed tar archive.
type Bundle struct {
	gz  *gzip.Writer
	tw  *tar.Writer
	now time.Time
}

// NewBundle starts a bundle on w.
func NewBundle(w io.Writer) *Bundle {
	gz := gzip.NewWriter(w)
	return &Bundle{gz: gz, tw: tar.NewWriter(gz), now: time.Now()}
}

// Add adds a file. Text from outside the owner's machine should go through
// redact.Secrets first.
func (b *Bundle) Add(name string, data []byte) error {
	if err := b.tw.WriteHeader(&tar.Header{Name: name, Mode: 0o600, Size: int64(len(data)), ModTime: b.now, Typeflag: tar.TypeReg}); err != nil {
		return err
	}
	_, err := b.tw.Write(data)
	return err
}

// AddNode streams node n's support bundle into dir/: each of its files
// is redacted again (the owner's side does not rely on the node's) and
// the whole is bounded by MaxNodeBundle.
func (b *Bundle) AddNode(ctx context.Context, dir string, n *Node) error {
	stream, err := n.Client.Support(ctx, &inspectpb.SupportRequest{})
	if err != nil {
		return termtext.Error(err)
	}
	pr, pw := io.Pipe()
	go func() {
		for {
			c, err := stream.Recv()
			if err != nil {
				if errors.Is(err, io.EOF) {
					err = nil
				}
				pw.CloseWithError(err)
				return
			}
			if _, err := pw.Write(c.GetData()); err != nil {
				return
			}
		}
	}()
	defer pr.Close()
	gz, err := gzip.NewReader(pr)
	if err != nil {
		return fmt.Errorf("the node's support bundle: %w", err)
	}
	tr := tar.NewReader(io.LimitReader(gz, MaxNodeBundle))
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("the node's support bundle: %w", termtext.Error(err))
		}
		if h.Typeflag != tar.TypeReg || !validName(h.Name) {
			return fmt.Errorf("the node's support bundle holds %q, which is not one of its plain files", h.Name)
		}
		data, err := io.ReadAll(tr)
		if err != nil {
			return fmt.Errorf("the node's support bundle: %w", err)
		}
		if err := b.Add(dir+"/"+h.Name, []byte(redact.Secrets(string(data)))); err != nil {
			return err
		}
	}
}

// validName is a file name a node's bundle may hold: no directories, no
// way out of the node's own directory.
func validName(n string) bool {
	if n == "" || n == "." || n == ".." || len(n) > 128 {
		return false
	}
	for _, r := range n {
		if !(r == '.' || r == '-' || r == '_' || 'a' <= r && r <= 'z' || 'A' <= r && r <= 'Z' || '0' <= r && r <= '9') {
			return false
		}
	}
	return true
}

// Close finishes the archive.
func (b *Bundle) Close() error {
	if err := b.tw.Close(); err != nil {
		return err
	}
	return b.gz.Close()
}
