package etcd

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"path/filepath"
	"testing"
	"time"

	"github.com/orrery-dev/orrery/internal/testkit/apiservertest"
)

// TestSnapshotOfARealEtcd takes a snapshot of a real etcd over TLS with a
// client certificate, as of a kubeadm control plane's, and checks it.
func TestSnapshotOfARealEtcd(t *testing.T) {
	e := apiservertest.StartEtcd(t)
	m := Member{Endpoint: e.Endpoint, CACert: e.CACert, ClientCert: e.ClientCert, ClientKey: e.ClientKey}
	var buf bytes.Buffer
	w := NewWriter(&buf)
	parts := 0
	err := retry(t, func(ctx context.Context) error {
		buf.Reset()
		w, parts = NewWriter(&buf), 0
		return m.Stream(ctx, func(data []byte, _ uint64) error {
			parts++
			_, err := w.Write(data)
			return err
		})
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Check(); err != nil {
		t.Fatalf("a snapshot of a running etcd: %v", err)
	}
	// bbolt's pages: an empty etcd's database is still some pages.
	if w.Size() < 16<<10 || parts < 2 {
		t.Errorf("snapshot of %d bytes in %d parts, want a database and its hash", w.Size(), parts)
	}
}

// retry runs f until etcd, which starts with the test, answers.
func retry(t *testing.T, f func(context.Context) error) error {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		err := f(ctx)
		cancel()
		if err == nil || time.Now().After(deadline) {
			return err
		}
		time.Sleep(200 * time.Millisecond)
	}
}

func TestAClientWithoutTheCAsCertificateIsRefused(t *testing.T) {
	e := apiservertest.StartEtcd(t)
	other := apiservertest.StartEtcd(t) // a certificate of another CA
	good := Member{Endpoint: e.Endpoint, CACert: e.CACert, ClientCert: e.ClientCert, ClientKey: e.ClientKey}
	// Once etcd answers its own client, the refusal is its, not a
	// connection refused while it starts.
	if err := retry(t, func(ctx context.Context) error { return good.Stream(ctx, func([]byte, uint64) error { return nil }) }); err != nil {
		t.Fatal(err)
	}
	m := good
	m.ClientCert, m.ClientKey = other.ClientCert, other.ClientKey
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	err := m.Stream(ctx, func([]byte, uint64) error { return nil })
	if err == nil {
		t.Fatal("etcd gave a snapshot to a client its CA did not certify")
	}
	t.Logf("refused: %v", err)
}

func TestMissingCertificates(t *testing.T) {
	dir := t.TempDir()
	m := Member{Endpoint: "127.0.0.1:1", CACert: filepath.Join(dir, "ca.crt"), ClientCert: filepath.Join(dir, "c.crt"), ClientKey: filepath.Join(dir, "c.key")}
	if err := m.Stream(context.Background(), func([]byte, uint64) error { return nil }); err == nil {
		t.Fatal("no error without etcd's CA")
	}
}

func TestWriterCheck(t *testing.T) {
	db := bytes.Repeat([]byte("etcd database page "), 5000)
	sum := sha256.Sum256(db)
	whole := append(append([]byte{}, db...), sum[:]...)
	for name, c := range map[string]struct {
		stream []byte
		chunk  int
		want   error
	}{
		"whole, in parts":       {whole, 7, nil},
		"whole, in one":         {whole, len(whole), nil},
		"hash split over parts": {whole, len(whole) - 10, nil},
		"cut short":             {whole[:len(whole)-1], 4096, ErrCorrupt},
		"no hash":               {db, 4096, ErrCorrupt},
		"a byte changed":        {append([]byte{'E'}, whole[1:]...), 4096, ErrCorrupt},
		"shorter than a hash":   {sum[:10], 4, ErrCorrupt},
		"empty":                 {nil, 1, ErrCorrupt},
	} {
		t.Run(name, func(t *testing.T) {
			var out bytes.Buffer
			w := NewWriter(&out)
			for s := c.stream; len(s) > 0; {
				n := min(c.chunk, len(s))
				if _, err := w.Write(s[:n]); err != nil {
					t.Fatal(err)
				}
				s = s[n:]
			}
			if err := w.Check(); !errors.Is(err, c.want) {
				t.Errorf("Check() = %v, want %v", err, c.want)
			}
			if !bytes.Equal(out.Bytes(), c.stream) || w.Size() != int64(len(c.stream)) {
				t.Errorf("wrote %d bytes, want the stream's %d as they came", out.Len(), len(c.stream))
			}
		})
	}
}
