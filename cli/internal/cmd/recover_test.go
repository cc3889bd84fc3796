package cmd

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/pem"
	"errors"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"github.com/orrery-dev/orrery/internal/attestation/qemu/platformca"
	"github.com/orrery-dev/orrery/internal/keys"
	"github.com/orrery-dev/orrery/internal/owner"
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

// recoverInOrder stops once a majority of the control planes is back,
// goes on past one that fails, and fails if no majority came back.
func TestRecoverInOrder(t *testing.T) {
	three := []string{"10.42.1.100:9000", "10.42.1.101:9000", "10.42.1.102:9000"}
	for name, tc := range map[string]struct {
		fail     map[string]bool
		wantAsk  string
		wantErr  bool
		wantSaid string
	}{
		"all answer":        {nil, "10.42.1.100:9000 10.42.1.101:9000", false, "2 of 3 control planes are back"},
		"the first is lost": {map[string]bool{"10.42.1.100:9000": true}, "10.42.1.100:9000 10.42.1.101:9000 10.42.1.102:9000", false, "Recovered 2 of the 3 control planes named"},
		"two are lost":      {map[string]bool{"10.42.1.100:9000": true, "10.42.1.102:9000": true}, "10.42.1.100:9000 10.42.1.101:9000 10.42.1.102:9000", true, "was not recovered"},
	} {
		t.Run(name, func(t *testing.T) {
			var asked []string
			recoverNode := func(_ context.Context, cfg owner.RecoverConfig) error {
				asked = append(asked, cfg.Node)
				if tc.fail[cfg.Node] {
					return errors.New("no answer")
				}
				return nil
			}
			var out bytes.Buffer
			err := recoverInOrder(t.Context(), &out, recoverNode, owner.RecoverConfig{}, three, 3, time.Second)
			if (err != nil) != tc.wantErr || strings.Join(asked, " ") != tc.wantAsk || !strings.Contains(out.String(), tc.wantSaid) {
				t.Fatalf("recoverInOrder: %v, asked %v; want error %v, asked %s, saying %q:\n%s", err, asked, tc.wantErr, tc.wantAsk, tc.wantSaid, out.String())
			}
		})
	}
}

// Ctrl-C ends the recovery: the nodes not yet asked are not tried.
func TestRecoverInOrderStopsWhenCancelled(t *testing.T) {
	ctx, cancel := context.WithCancel(t.Context())
	var asked []string
	recoverNode := func(ctx context.Context, cfg owner.RecoverConfig) error {
		asked = append(asked, cfg.Node)
		cancel()
		return ctx.Err()
	}
	var out bytes.Buffer
	err := recoverInOrder(ctx, &out, recoverNode, owner.RecoverConfig{}, []string{"10.42.1.100:9000", "10.42.1.101:9000", "10.42.1.102:9000"}, 3, time.Second)
	if err == nil || len(asked) != 1 {
		t.Fatalf("recoverInOrder after Ctrl-C: %v, asked %v; want an error and no node asked after the first", err, asked)
	}
}

// A first node the owner removed is no control plane to recover: the
// workspace still names it, and recover trusts the approved ones alone.
func TestRecoverTrustsNoRemovedFirstNode(t *testing.T) {
	dir := t.TempDir()
	writeRecoverWorkspace(t, dir)
	ws := workspace.Dir(dir)
	if cp, _, _, err := recordedControlPlane(ws); err != nil || cp.ID != "42" {
		t.Fatalf("before the removal: %v, %v; want instance 42", cp, err)
	}
	if err := ws.RecordRemoved("cp-0", []string{"42"}); err != nil {
		t.Fatal(err)
	}
	cp, ca, endpoint, err := recordedControlPlane(ws)
	if err != nil || !cp.IsZero() || len(ca) == 0 || endpoint != "10.42.1.100:6443" {
		t.Errorf("after the removal: %v, CA %d bytes, %q, %v; want no first node, the cluster's CA and endpoint", cp, len(ca), endpoint, err)
	}
}
