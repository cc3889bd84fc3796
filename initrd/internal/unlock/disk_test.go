package unlock

import (
	"bytes"
	"context"
	"crypto/x509"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"

	"github.com/google/go-tpm-tools/client"
	"github.com/google/go-tpm/legacy/tpm2"

	"github.com/orrery-dev/orrery/internal/attestation/measurements"
	"github.com/orrery-dev/orrery/internal/attestation/qemu"
	"github.com/orrery-dev/orrery/internal/attestation/qemu/qemutest"
	"github.com/orrery-dev/orrery/internal/attestation/vtpm"
	"github.com/orrery-dev/orrery/internal/cryptsetup"
	"github.com/orrery-dev/orrery/internal/swtpm/swtpmtest"
)

const diskUUID = "3f6a1c2e-5b7d-4e8f-9a0b-1c2d3e4f5a6b"

// fileLUKS is cryptsetup on a LUKS2 volume in a file: keys are tried by
// the real cryptsetup; opening is recorded instead, since test hosts may
// lack device-mapper.
type fileLUKS struct {
	cryptsetup.Tool
	mu     sync.Mutex
	tests  int
	opened []string
}

func (f *fileLUKS) TestKey(ctx context.Context, dev, keyFile string) (bool, error) {
	f.mu.Lock()
	f.tests++
	f.mu.Unlock()
	return f.Tool.TestKey(ctx, dev, keyFile)
}

func (f *fileLUKS) OpenLUKS(ctx context.Context, dev, name, keyFile string) error {
	if ok, err := f.Tool.TestKey(ctx, dev, keyFile); err != nil || !ok {
		return err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.opened = append(f.opened, name)
	return nil
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
	err := luks.FormatLUKS2(context.Background(), dev, kf, cryptsetup.FormatOpts{Format: cryptsetup.EncryptedOnly, PBKDF: "pbkdf2", Iterations: 1000, UUID: diskUUID})
	if err != nil {
		t.Fatal(err)
	}
	os.Remove(kf)
	return &Unlocker{LUKS: luks, Device: dev, MapperName: "state", KeyDir: t.TempDir()}, luks
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
