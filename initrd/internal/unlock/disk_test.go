package unlock

import (
	"bytes"
	"context"
	"crypto/x509"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/google/go-tpm-tools/client"
	"github.com/google/go-tpm/legacy/tpm2"

	"github.com/orrery-dev/orrery/internal/attestation/measurements"
	"github.com/orrery-dev/orrery/internal/attestation/qemu"
	"github.com/orrery-dev/orrery/internal/attestation/qemu/qemutest"
	"github.com/orrery-dev/orrery/internal/attestation/vtpm"
	"github.com/orrery-dev/orrery/internal/disk/cryptsetup"
	"github.com/orrery-dev/orrery/internal/tpm/swtpm/swtpmtest"
)

const diskUUID = "3f6a1c2e-5b7d-4e8f-9a0b-1c2d3e4f5a6b"

// fileLUKS is cryptsetup on a LUKS2 volume in a file: headers are
// copied and checked, and keys tried, by the real cryptsetup; opening is
// recorded instead, since test hosts may lack device-mapper, and the
// kernel's table is table (mappedTable if nil).
type fileLUKS struct {
	cryptsetup.Tool
	table  []byte
	mu     sync.Mutex
	saves  int
	tests  int
	opened []string
}

// testHeader is how newDisk formats: the initrd's format without
// integrity, which needs device-mapper.
var testHeader = func() cryptsetup.Header {
	h := cryptsetup.StateDisk
	h.Format = cryptsetup.EncryptedOnly
	return h
}()

// mappedTable is the device-mapper table dm-crypt shows for a volume of
// testHeader, as 'dmsetup table' prints it (key masked).
var mappedTable = []byte("0 32768 crypt aes-xts-plain64 " + strings.Repeat("0", 128) + " 0 254:16 32768 1 sector_size:4096\n")

func (f *fileLUKS) SaveHeader(ctx context.Context, dev, path string, h cryptsetup.Header) (cryptsetup.Volume, error) {
	f.mu.Lock()
	f.saves++
	f.mu.Unlock()
	return f.Tool.SaveHeader(ctx, dev, path, h)
}

func (f *fileLUKS) TestKeyWithHeader(ctx context.Context, dev, header, keyFile string) (bool, error) {
	f.mu.Lock()
	f.tests++
	f.mu.Unlock()
	return f.Tool.TestKeyWithHeader(ctx, dev, header, keyFile)
}

func (f *fileLUKS) OpenChecked(ctx context.Context, dev, header, name, keyFile string, h cryptsetup.Header) error {
	if ok, err := f.Tool.TestKeyWithHeader(ctx, dev, header, keyFile); err != nil || !ok {
		return fmt.Errorf("no key opens %s (%w)", dev, err)
	}
	table := f.table
	if table == nil {
		table = mappedTable
	}
	if err := h.CheckTable(name, table); err != nil {
		return err // and the Tool closes the mapping
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.opened = append(f.opened, name)
	return nil
}

func (f *fileLUKS) counts() (saves, tests, opened int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.saves, f.tests, len(f.opened)
}

func (f *fileLUKS) keyTests() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.tests
}

// newDisk formats a LUKS2 volume that key opens and returns an Unlocker
// for it.
func newDisk(t *testing.T, key []byte) (*Unlocker, *fileLUKS) {
	t.Helper()
	if _, err := exec.LookPath("cryptsetup"); err != nil {
		t.Skip("cryptsetup not installed (make deps)")
	}
	dir := t.TempDir()
	dev := filepath.Join(dir, "state.img")
	if err := os.WriteFile(dev, make([]byte, 32<<20), 0o600); err != nil {
		t.Fatal(err)
	}
	kf := filepath.Join(dir, "key")
	if err := os.WriteFile(kf, key, 0o400); err != nil {
		t.Fatal(err)
	}
	luks := &fileLUKS{}
	opts := testHeader.FormatOpts()
	opts.UUID = diskUUID
	if err := luks.FormatLUKS2(context.Background(), dev, kf, opts); err != nil {
		t.Fatal(err)
	}
	os.Remove(kf)
	return &Unlocker{LUKS: luks, Device: dev, MapperName: "state", KeyDir: t.TempDir(), Header: testHeader}, luks
}

// header is the volume's LUKS2 header area, to show it unchanged.
func header(t *testing.T, u *Unlocker) []byte {
	t.Helper()
	f, err := os.Open(u.Device)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	b := make([]byte, 16<<20)
	if _, err := f.ReadAt(b, 0); err != nil {
		t.Fatal(err)
	}
	return b
}

func isOpen(u *Unlocker) bool {
	select {
	case <-u.Opened():
		return true
	default:
		return false
	}
}

// imageOf is what a verifier expects of node's image: its PCRs 4, 9, 11
// and 15 as they are now.
func imageOf(t *testing.T, n *qemutest.Node) measurements.M {
	t.Helper()
	rw := swtpmtest.Open(t, n.TPM)
	defer rw.Close()
	pcrs, err := client.ReadPCRs(rw, tpm2.PCRSelection{Hash: tpm2.AlgSHA256, PCRs: []int{4, 9, 11, 15}})
	if err != nil {
		t.Fatal(err)
	}
	m := measurements.M{}
	for pcr, v := range pcrs.GetPcrs() {
		m[pcr] = measurements.Measurement{Expected: bytes.Clone(v)}
	}
	return m
}

// validatorOf accepts nodes of n's platform that show n's image.
func validatorOf(t *testing.T, n *qemutest.Node) *vtpm.Validator {
	t.Helper()
	v, err := qemu.NewValidator(qemu.ValidatorConfig{Measurements: imageOf(t, n), PlatformCAs: []*x509.Certificate{n.CA.Cert}})
	if err != nil {
		t.Fatal(err)
	}
	return v
}
