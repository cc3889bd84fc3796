package inspectserver

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"fmt"
	"io"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"

	"github.com/orrery-dev/orrery/internal/proto/inspectpb"
)

// Bounds of a node's support bundle, before compression. A busy node writes
// tens of megabytes of journal per day; the newest part of this boot's and
// the end of the one before say what went wrong.
const (
	supportBootBytes     = 32 << 20
	supportPreviousBytes = 8 << 20
	supportKernelBytes   = 4 << 20
	supportLines         = 200000
	supportChunk         = 64 << 10
)

// Support implements inspectpb.InspectServiceServer.
func (s *Server) Support(_ *inspectpb.SupportRequest, stream inspectpb.InspectService_SupportServer) error {
	ctx := stream.Context()
	if err := s.authorize(ctx, "Support"); err != nil {
		return err
	}
	w := &chunkWriter{send: func(b []byte) error { return stream.Send(&inspectpb.SupportChunk{Data: b}) }}
	if err := s.writeBundle(ctx, w); err != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		return status.Errorf(codes.Unavailable, "support bundle: %v", err)
	}
	return w.flush()
}

// writeBundle writes the node's gzip-compressed tar archive to w. A part
// the node cannot read becomes a file that says why, so one broken source
// does not cost the rest.
func (s *Server) writeBundle(ctx context.Context, w io.Writer) error {
	gz := gzip.NewWriter(w)
	tw := tar.NewWriter(gz)
	now := time.Now()
	add := func(name string, data []byte) error {
		hdr := &tar.Header{Name: name, Mode: 0o644, Size: int64(len(data)), ModTime: now, Typeflag: tar.TypeReg}
		if err := tw.WriteHeader(hdr); err != nil {
			return err
		}
		_, err := tw.Write(data)
		return err
	}
	st, _ := protojson.MarshalOptions{Multiline: true}.Marshal(s.cfg.Status())
	if err := add("status.json", st); err != nil {
		return err
	}
	units := []byte("the node is in its initrd: no systemd units\n")
	if s.cfg.Units != nil {
		if us, err := s.cfg.Units.Units(ctx, ""); err != nil {
			units = []byte("cannot list units: " + err.Error() + "\n")
		} else {
			units = FormatUnits(us)
		}
	}
	if err := add("units.txt", units); err != nil {
		return err
	}
	for _, part := range []struct {
		name  string
		q     Query
		limit int
	}{
		{"journal.log", Query{Lines: supportLines}, supportBootBytes},
		{"journal-previous-boot.log", Query{Boot: -1, Lines: supportLines}, supportPreviousBytes},
		{"kernel.log", Query{Kernel: true, Lines: supportLines}, supportKernelBytes},
	} {
		if err := add(part.name, s.journalText(ctx, part.q, part.limit)); err != nil {
			return err
		}
	}
	if err := tw.Close(); err != nil {
		return err
	}
	return gz.Close()
}

// journalText is the newest entries of q as text, at most limit bytes.
func (s *Server) journalText(ctx context.Context, q Query, limit int) []byte {
	var lines [][]byte
	size := 0
	err := s.cfg.Journal.Read(ctx, q, func(es []*inspectpb.JournalEntry) error {
		for _, e := range es {
			l := []byte(FormatEntry(e) + "\n")
			lines = append(lines, l)
			size += len(l)
		}
		// Keep the newest: drop the oldest once over the limit.
		for size > limit && len(lines) > 0 {
			size -= len(lines[0])
			lines = lines[1:]
		}
		return nil
	})
	out := bytes.Join(lines, nil)
	if err != nil {
		out = append(out, fmt.Sprintf("[the node could not read more: %v]\n", err)...)
	}
	return out
}

// FormatUnits renders units as `systemctl list-units` does.
func FormatUnits(us []*inspectpb.Unit) []byte {
	var b bytes.Buffer
	fmt.Fprintf(&b, "%-50s %-10s %-12s %-10s %s\n", "UNIT", "LOAD", "ACTIVE", "SUB", "DESCRIPTION")
	for _, u := range us {
		fmt.Fprintf(&b, "%-50s %-10s %-12s %-10s %s\n", u.GetName(), u.GetLoadState(), u.GetActiveState(), u.GetSubState(), u.GetDescription())
	}
	return b.Bytes()
}

// chunkWriter sends what is written to it in chunks of supportChunk bytes.
type chunkWriter struct {
	buf  []byte
	send func([]byte) error
}

func (c *chunkWriter) Write(p []byte) (int, error) {
	c.buf = append(c.buf, p...)
	for len(c.buf) >= supportChunk {
		if err := c.send(bytes.Clone(c.buf[:supportChunk])); err != nil {
			return 0, err
		}
		c.buf = c.buf[supportChunk:]
	}
	return len(p), nil
}

func (c *chunkWriter) flush() error {
	if len(c.buf) == 0 {
		return nil
	}
	err := c.send(c.buf)
	c.buf = nil
	return err
}
