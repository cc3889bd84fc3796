package unlock

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/orrery-dev/orrery/internal/attestation/qemu/platformca"
	"github.com/orrery-dev/orrery/internal/attestation/qemu/qemutest"
	"github.com/orrery-dev/orrery/internal/disk/cryptsetup"
	"github.com/orrery-dev/orrery/internal/disk/cryptsetup/headertest"
	"github.com/orrery-dev/orrery/internal/proto/joinpb"
)

// Ways a host rewrites the header of a node's state disk, each with the
// field the Unlocker's check names.
var tampering = map[string]struct {
	edit  func(m map[string]any)
	field string
}{
	// The review's nullsegment.py: the real keyslots, the host's
	// plaintext.
	"cipher_null segment": {headertest.NullSegment, "segments.0.encryption"},
	// The review's craft.py: a keyslot any passphrase opens
	// (cryptsetup < 2.8.1).
	"cipher_null keyslot": {func(m map[string]any) {
		a := headertest.At(m, "keyslots", "0", "area")
		a["encryption"], a["key_size"] = "cipher_null-ecb", json.Number("0")
	}, "keyslots.0.area.encryption"},
	"token": {func(m map[string]any) {
		headertest.At(m, "tokens")["0"] = map[string]any{"type": "x", "keyslots": []string{"0"}}
	}, "tokens"},
}

var rightKey = bytes.Repeat([]byte{1}, 32)

// keyDirEmpty fails if the Unlocker left a key or a header copy behind.
func keyDirEmpty(t *testing.T, u *Unlocker) {
	t.Helper()
	if left, err := os.ReadDir(u.KeyDir); err != nil || len(left) != 0 {
		t.Errorf("left in the key directory: %v, %v", left, err)
	}
}

// A tampered header is refused before any key is tried, even the right
// one, and stays refused.
func TestTamperedHeaderIsNeverTried(t *testing.T) {
	for name, tc := range tampering {
		t.Run(name, func(t *testing.T) {
			u, luks := newDisk(t, rightKey)
			headertest.Rewrite(t, u.Device, tc.edit)
			before := header(t, u)
			for range 2 {
				err := u.Try(context.Background(), Key{DiskKey: rightKey, MeasurementSecret: make([]byte, 32), From: "test"})
				var fe *cryptsetup.FormatError
				if !errors.Is(err, ErrRefused) || !errors.As(err, &fe) || fe.Field != tc.field {
					t.Fatalf("Try = %v, want ErrRefused naming %s", err, tc.field)
				}
			}
			if saves, tests, opened := luks.counts(); saves != 1 || tests != 0 || opened != 0 || isOpen(u) {
				t.Errorf("header read %d times, key tried %d times, opened %d times", saves, tests, opened)
			}
			if !bytes.Equal(header(t, u), before) {
				t.Error("the refused disk's header changed")
			}
			keyDirEmpty(t, u)
		})
	}
}

// A mapping that is not what the header makes is refused, and no later
// key is tried.
func TestRefusedMapping(t *testing.T) {
	u, luks := newDisk(t, rightKey)
	luks.table = []byte("0 32768 crypt cipher_null-ecb - 0 254:16 32768 1 sector_size:4096\n")
	err := u.Try(context.Background(), Key{DiskKey: rightKey, MeasurementSecret: make([]byte, 32), From: "test"})
	var fe *cryptsetup.FormatError
	if !errors.Is(err, ErrRefused) || !errors.As(err, &fe) || fe.Field != "cipher" {
		t.Fatalf("Try = %v, want ErrRefused naming the cipher", err)
	}
	if err := u.Try(context.Background(), Key{DiskKey: rightKey, MeasurementSecret: make([]byte, 32), From: "test"}); !errors.Is(err, ErrRefused) {
		t.Fatalf("second Try = %v, want ErrRefused", err)
	}
	if _, tests, opened := luks.counts(); tests != 1 || opened != 0 || isOpen(u) {
		t.Errorf("key tried %d times, opened %d times", tests, opened)
	}
}

// The disk is opened with the header that was checked: rewriting the
// disk's header after the check changes nothing.
func TestOpensWithTheCheckedHeader(t *testing.T) {
	u, luks := newDisk(t, rightKey)
	if err := u.Check(context.Background()); err != nil {
		t.Fatal(err)
	}
	headertest.Rewrite(t, u.Device, headertest.NullSegment)
	if err := u.Try(context.Background(), Key{DiskKey: rightKey, MeasurementSecret: make([]byte, 32), From: "test"}); err != nil {
		t.Fatal(err)
	}
	if saves, _, opened := luks.counts(); saves != 1 || opened != 1 || !isOpen(u) {
		t.Errorf("header read %d times, opened %d times", saves, opened)
	}
	keyDirEmpty(t, u)
}

// A rejoining node with a tampered disk asks no join service for its key.
func TestRejoinAsksNothingForARefusedDisk(t *testing.T) {
	ca, err := platformca.New("test platform CA")
	if err != nil {
		t.Fatal(err)
	}
	node := qemutest.NewNodeOf(t, ca).Boot(t, "image-1", "image-1")
	cp := qemutest.NewNodeOf(t, ca).Boot(t, "image-1", "image-1").Lock(t, "cluster")
	u, luks := newDisk(t, rightKey)
	headertest.Rewrite(t, u.Device, headertest.NullSegment)
	svc := &joinService{tickets: []*joinpb.IssueRejoinTicketResponse{ticket(1, 2)}}
	start := time.Now()
	console := rejoin(t, node, cp, svc, u, &meta{}, time.Minute)
	if took := time.Since(start); took > 30*time.Second {
		t.Errorf("the rejoin went on for %s", took)
	}
	if _, tests, _ := luks.counts(); isOpen(u) || svc.calls() != 0 || tests != 0 {
		t.Fatalf("asked the join service %d times, tried %d keys", svc.calls(), tests)
	}
	if !strings.Contains(console, "not asking the join service") || !strings.Contains(console, `segments.0.encryption is "cipher_null-ecb"`) {
		t.Errorf("console does not say why:\n%s", console)
	}
}

// The owner is told not to recover a node whose disk was tampered with,
// and the master secret is not tried on it.
func TestRecoverRefusedDisk(t *testing.T) {
	ms := masterSecret(t)
	key, err := ms.DiskKey(diskUUID)
	if err != nil {
		t.Fatal(err)
	}
	u, luks := newDisk(t, key)
	headertest.Rewrite(t, u.Device, headertest.NullSegment)
	var console strings.Builder
	s := &RecoverServer{DiskUUID: diskUUID, Unlocker: u, Say: func(format string, args ...any) { console.WriteString(format + "\n") }}
	_, err = s.Recover(context.Background(), withCluster(t, ms))
	st := status.Convert(err)
	if st.Code() != codes.FailedPrecondition || !strings.Contains(st.Message(), "segments.0.encryption") || !strings.Contains(st.Message(), "do not recover this node") {
		t.Fatalf("Recover = %v", err)
	}
	if _, tests, _ := luks.counts(); tests != 0 || isOpen(u) {
		t.Errorf("the master secret's key was tried %d times", tests)
	}
	if !strings.Contains(console.String(), "refused a recovery") {
		t.Errorf("console: %s", console.String())
	}
}
