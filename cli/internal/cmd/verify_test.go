package cmd

import (
	"bytes"
	"context"
	"crypto/sha256"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"google.golang.org/grpc"

	"github.com/orrery-dev/orrery/internal/atls"
	"github.com/orrery-dev/orrery/internal/attestation/measurements"
	"github.com/orrery-dev/orrery/internal/attestation/qemu/qemutest"
)

// startNode serves attested TLS from a provisioned swtpm, as bootstrapperd
// does, with no gRPC service registered. It returns the address and the
// platform CA certificate file.
func startNode(t *testing.T) (string, string) {
	t.Helper()
	n := qemutest.NewNode(t)
	n.Measure(t, 11, "enter-initrd", "initrd")
	iss := n.Issuer
	creds, err := atls.NewCredentials(atls.Config{Issuer: iss})
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer(grpc.Creds(creds))
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(lis)
	t.Cleanup(srv.Stop)
	caPath := n.CAFile(t)
	return lis.Addr().String(), caPath
}

func writeMeasurements(t *testing.T, pcr11 []byte) string {
	t.Helper()
	zero := make([]byte, 32)
	m := measurements.M{4: {Expected: zero}, 11: {Expected: pcr11}, 15: {Expected: zero}}
	raw, err := m.MarshalJSON()
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "measurements.json")
	if err := os.WriteFile(path, raw, 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

func TestVerify(t *testing.T) {
	addr, caPath := startNode(t)
	d := sha256.Sum256([]byte("enter-initrd"))
	pcr11 := sha256.Sum256(append(make([]byte, 32), d[:]...))

	tests := map[string]struct {
		args     []string
		wantCode int
		wantOut  string
		wantErr  string
	}{
		"matching node": {
			args:    []string{"--measurements", writeMeasurements(t, pcr11[:]), "--platform-ca", caPath},
			wantOut: "OK: " + addr + " attested as qemu-vtpm",
		},
		"prints the certified instance": {
			args:    []string{"--measurements", writeMeasurements(t, pcr11[:]), "--platform-ca", caPath},
			wantOut: `Its platform certifies it as instance "worker-0" with instance ID `,
		},
		"wrong PCR 11": {
			args:     []string{"--measurements", writeMeasurements(t, bytes.Repeat([]byte{9}, 32)), "--platform-ca", caPath},
			wantCode: 1, wantErr: "PCR 11 mismatch",
		},
		"no platform CA": {
			args:     []string{"--measurements", writeMeasurements(t, pcr11[:])},
			wantCode: 1, wantErr: "no --platform-ca given",
		},
		"missing measurements file": {
			args:     []string{"--measurements", "/nonexistent/measurements.json", "--platform-ca", caPath},
			wantCode: 1, wantErr: "load measurements",
		},
	}
	checkYAMLMatchesJSON(t, execute, []string{"verify", "--node", addr, "--timeout", "20s", "--measurements", writeMeasurements(t, pcr11[:]), "--platform-ca", caPath})
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			var out, errOut bytes.Buffer
			args := append([]string{"verify", "--node", addr, "--timeout", "20s"}, tc.args...)
			code := Execute(context.Background(), args, &out, &errOut)
			if code != tc.wantCode {
				t.Fatalf("exit code %d, want %d; stderr: %s", code, tc.wantCode, errOut.String())
			}
			if !strings.Contains(out.String(), tc.wantOut) {
				t.Errorf("stdout %q does not contain %q", out.String(), tc.wantOut)
			}
			if !strings.Contains(errOut.String(), tc.wantErr) {
				t.Errorf("stderr %q does not contain %q", errOut.String(), tc.wantErr)
			}
		})
	}
}
