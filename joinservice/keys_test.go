package main

import (
	"bytes"
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/orrery-dev/orrery/internal/keys"
)

func writeMasterSecret(t *testing.T) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "master-secret.json")
	ms := keys.MasterSecret{Key: bytes.Repeat([]byte{1}, keys.KeySize), Salt: bytes.Repeat([]byte{2}, keys.SaltSize)}
	if err := keys.WriteMasterSecretFile(path, ms); err != nil {
		t.Fatal(err)
	}
	return path
}

// The pod is on the host network: a loopback port would answer every
// process and host-network pod on the node, so none is accepted.
func TestKeyServiceRefusesNetworkAddresses(t *testing.T) {
	secret := writeMasterSecret(t)
	for _, addr := range []string{"127.0.0.1:0", "[::1]:0", "0.0.0.0:0", "localhost:0", "keys.sock"} {
		t.Run(addr, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
			defer cancel()
			if err := runKeys(ctx, []string{"--listen", addr, "--master-secret", secret}); err == nil {
				t.Fatalf("the key service served on %s", addr)
			}
		})
	}
}

// startKeys runs the key service on socket until the test ends.
func startKeys(t *testing.T, socket string) {
	t.Helper()
	secret := writeMasterSecret(t)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- runKeys(ctx, []string{"--listen", socket, "--master-secret", secret}) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("key service: %v", err)
		}
	})
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if fi, err := os.Stat(socket); err == nil && fi.Mode()&os.ModeSocket != 0 && fi.Mode().Perm() == 0o600 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("the key service did not create its socket")
		}
		select {
		case err := <-done:
			done <- nil // for the clean-up, which waits for it
			t.Fatalf("key service stopped: %v", err)
		default:
		}
	}
}

// dialAs connects to socket with the file-system identity of uid, as a
// process of another user on the node would. fsuid is per thread: the
// goroutine keeps its thread locked and ends with it, so no other
// goroutine runs with the changed identity.
func dialAs(t *testing.T, uid int, socket string) error {
	t.Helper()
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread exits with the goroutine
		unix.Setfsuid(uid)
		if cur, _ := unix.SetfsuidRetUid(-1); cur != uid {
			errc <- errors.New("setfsuid did not take effect")
			return
		}
		conn, err := net.Dial("unix", socket)
		if err == nil {
			conn.Close()
		}
		errc <- err
	}()
	return <-errc
}

func TestOnlyTheJoinServiceGetsKeys(t *testing.T) {
	base, err := os.MkdirTemp("", "keyservice-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(base) })
	// Everyone may traverse the path down to the pod's emptyDir, and
	// kubelet makes the emptyDir itself 0777: only the key service's own
	// permissions keep other users out.
	if err := os.Chmod(base, 0o755); err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(base, "keyservice")
	if err := os.Mkdir(dir, 0o777); err != nil {
		t.Fatal(err)
	}
	os.Chmod(dir, 0o777)
	socket := filepath.Join(dir, "keys.sock")
	startKeys(t, socket)

	kc, err := dialKeys(socket)
	if err != nil {
		t.Fatal(err)
	}
	defer kc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	key, err := kc.GetDataKey(ctx, "5f0c2d1e-8a4b-4c3d-9e2f-1a2b3c4d5e6f", 32)
	if err != nil || len(key) != 32 {
		t.Fatalf("the join service's client got %d bytes, %v", len(key), err)
	}

	if fi, err := os.Stat(dir); err != nil || fi.Mode().Perm() != 0o700 {
		t.Errorf("socket directory mode = %v, %v; want 0700", fi.Mode().Perm(), err)
	}
	if os.Geteuid() != 0 {
		t.Skip("needs root to try the socket as another user")
	}
	if err := dialAs(t, 65534, socket); !errors.Is(err, syscall.EACCES) {
		t.Errorf("a process of another user (nobody) connecting to the key service: err = %v, want permission denied", err)
	}
}
