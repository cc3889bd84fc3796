package cmd

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"path/filepath"
	"strings"
	"testing"

	"github.com/orrery-dev/orrery/internal/keys"
)

// The refusals of recover's own input; the protocol is tested with the
// initrd's real recovery server (initrd/internal/unlock) and in the
// initrd's VM test.
func TestRecoverInput(t *testing.T) {
	addr, caPath := startNode(t)
	d := sha256.Sum256([]byte("enter-initrd"))
	pcr11 := sha256.Sum256(append(make([]byte, 32), d[:]...))
	secret := filepath.Join(t.TempDir(), "orrery-master-secret.json")
	ms, err := keys.GenerateMasterSecret(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	if err := keys.WriteMasterSecretFile(secret, ms); err != nil {
		t.Fatal(err)
	}
	m := writeMeasurements(t, pcr11[:])
	tests := map[string]struct {
		args    []string
		wantErr string
	}{
		"no master secret": {
			args:    []string{"--measurements", m, "--platform-ca", caPath, "--master-secret", "/nonexistent/secret.json"},
			wantErr: "pass --master-secret",
		},
		"no platform CA and no mini": {
			args:    []string{"--measurements", m, "--master-secret", secret, "--mini-dir", t.TempDir()},
			wantErr: "no --platform-ca given",
		},
		"missing measurements": {
			args:    []string{"--measurements", "/nonexistent/m.json", "--platform-ca", caPath, "--master-secret", secret},
			wantErr: "load measurements",
		},
		"a node of another image": {
			args:    []string{"--measurements", writeMeasurements(t, bytes.Repeat([]byte{9}, 32)), "--platform-ca", caPath, "--master-secret", secret},
			wantErr: "PCR 11 mismatch",
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			var out, errOut bytes.Buffer
			args := append([]string{"recover", "--node", addr, "--timeout", "20s"}, tc.args...)
			if code := Execute(context.Background(), args, &out, &errOut); code != 1 {
				t.Fatalf("exit code %d, want 1; stderr: %s", code, errOut.String())
			}
			if !strings.Contains(errOut.String(), tc.wantErr) {
				t.Errorf("stderr %q does not contain %q", errOut.String(), tc.wantErr)
			}
			if strings.Contains(out.String()+errOut.String(), string(ms.Key)) {
				t.Error("the master secret was printed")
			}
		})
	}
}
