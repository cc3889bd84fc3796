package cmd

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/pem"
	"path/filepath"
	"strings"
	"testing"

	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"github.com/orrery-dev/orrery/internal/attestation/qemu/platformca"
	"github.com/orrery-dev/orrery/internal/keys"
	"github.com/orrery-dev/orrery/internal/owner/workspace"
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
	// A master secret whose workspace records no control plane.
	bare := filepath.Join(t.TempDir(), "orrery-master-secret.json")
	if err := keys.WriteMasterSecretFile(bare, ms); err != nil {
		t.Fatal(err)
	}
	writeRecoverWorkspace(t, filepath.Dir(secret))
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
		"a workspace without its state": {
			args:    []string{"--measurements", m, "--platform-ca", caPath, "--master-secret", bare},
			wantErr: "read orrery-state.json beside the master secret",
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

// writeRecoverWorkspace writes what 'orrery init' leaves beside the master
// secret that recover reads: the state with the control plane's instance,
// and the admin kubeconfig with the cluster's CA and API server.
func writeRecoverWorkspace(t *testing.T, dir string) {
	t.Helper()
	ws := workspace.Dir(dir)
	st := workspace.State{Node: "10.42.1.100:9000", ClusterName: "demo", MeasurementSalt: bytes.Repeat([]byte{1}, 32),
		FirstNode: &workspace.FirstNode{Name: "cp-0", InstanceID: "42", DiskUUID: "6c9b5e9e-8c2b-4c43-9d55-6f6c0e0b7e51"}}
	if err := ws.WriteState(st); err != nil {
		t.Fatal(err)
	}
	ca, err := platformca.New("kubernetes")
	if err != nil {
		t.Fatal(err)
	}
	kc := clientcmdapi.NewConfig()
	kc.Clusters["demo"] = &clientcmdapi.Cluster{Server: "https://10.42.1.100:6443", CertificateAuthorityData: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: ca.Cert.Raw})}
	kc.Contexts["admin@demo"] = &clientcmdapi.Context{Cluster: "demo", AuthInfo: "admin"}
	kc.AuthInfos["admin"] = &clientcmdapi.AuthInfo{}
	kc.CurrentContext = "admin@demo"
	if err := clientcmd.WriteToFile(*kc, ws.Path(workspace.KubeconfigFile)); err != nil {
		t.Fatal(err)
	}
}
