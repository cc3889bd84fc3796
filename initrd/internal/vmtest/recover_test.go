package vmtest

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/crypto/bcrypt"

	"github.com/orrery-dev/orrery/internal/attestation"
	"github.com/orrery-dev/orrery/internal/attestation/measurements"
	"github.com/orrery-dev/orrery/internal/attestation/policy"
	"github.com/orrery-dev/orrery/internal/attestation/qemu/platformca"
	"github.com/orrery-dev/orrery/internal/cloud/metadataserver"
	"github.com/orrery-dev/orrery/internal/cloud/vm"
	"github.com/orrery-dev/orrery/internal/keys"
	"github.com/orrery-dev/orrery/internal/metadata"
	"github.com/orrery-dev/orrery/internal/nodelock"
	"github.com/orrery-dev/orrery/internal/owner"
	"github.com/orrery-dev/orrery/internal/proto/recoverpb"
	"github.com/orrery-dev/orrery/internal/role"
)

// pipeEnv makes the test binary a pipe between its stdin/stdout and the
// TCP address in the variable: QEMU's user network runs it for each
// guest connection to a forwarded address (guestfwd=...-cmd:).
const pipeEnv = "ORRERY_VMTEST_PIPE"

func pipe(addr string) int {
	c, err := net.Dial("tcp", addr)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	go func() {
		io.Copy(c, os.Stdin)
		c.(*net.TCPConn).CloseWrite()
	}()
	io.Copy(os.Stdout, c)
	return 0
}

// serveMetadata answers the node's metadata requests about instances,
// which arrive through QEMU's user network from 127.0.0.1: the node is
// the instance with that address.
func serveMetadata(t *testing.T, instances []metadata.Instance) string {
	t.Helper()
	hash, err := bcrypt.GenerateFromPassword([]byte("x"), bcrypt.MinCost)
	if err != nil {
		t.Fatal(err)
	}
	h, err := metadataserver.NewHandler(metadataserver.Config{
		Instances:      instances,
		InitSecretHash: hash,
	})
	if err != nil {
		t.Fatal(err)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: h}
	go srv.Serve(lis)
	t.Cleanup(func() { srv.Close() })
	return lis.Addr().String()
}

func freePort(t *testing.T) int {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer lis.Close()
	return lis.Addr().(*net.TCPAddr).Port
}

// TestRecoveryInTheInitrd boots a control plane whose state disk belongs
// to a cluster while no join service is reachable: the initrd serves
// recovery; the owner's 'orrery recover' path with another cluster's
// master secret is refused, with the right one the node opens its disk,
// extends PCR 15 with the cluster ID and boots on. The disk is the one
// the node's first boot formatted, re-keyed to the cluster as
// bootstrapperd does.
func TestRecoveryInTheInitrd(t *testing.T) {
	f := setup(t)
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	ms, err := keys.GenerateMasterSecret(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(t.TempDir(), "vm")
	ca, err := platformca.New("test platform CA")
	if err != nil {
		t.Fatal(err)
	}
	meta := serveMetadata(t, []metadata.Instance{{Name: "cp-0", Role: role.ControlPlane, IP: netip.MustParseAddr("127.0.0.1")}})
	port := freePort(t)
	// The guest's network is 169.254.169.0/24 so that the metadata
	// address is inside it and QEMU can forward it to the test's server.
	netdev := "user,id=n0,net=169.254.169.0/24,dhcpstart=169.254.169.15" +
		",guestfwd=tcp:169.254.169.254:80-cmd:env " + pipeEnv + "=" + meta + " " + exe +
		",hostfwd=tcp:127.0.0.1:" + strconv.Itoa(port) + "-:" + strconv.Itoa(recoverpb.Port)
	inst := platformca.NewInstance("cp-0")
	// First boot, on the same VM and devices: the initrd formats the
	// state disk; then the node joins its cluster.
	console := waitExit(t, startNetworked(t, f, "initrd-recover-first", dir, netdev, ca, inst))
	_, salt := joinCluster(t, dir, console, ms)

	v := startNetworked(t, f, "initrd-recover", dir, netdev, ca, inst)
	waitFor(t, v, fmt.Sprintf("serving recovery on port %d", recoverpb.Port))

	// PCR 11 of this initrd's boot: its two phase markers (direct kernel
	// boot, no UKI); PCR 15 zero until the node is unlocked.
	pcr11 := make([]byte, 32)
	for _, marker := range []string{"enter-initrd", "leave-initrd"} {
		pcr11 = extend(pcr11, []byte(marker))
	}
	clusterCA, err := platformca.New("kubernetes")
	if err != nil {
		t.Fatal(err)
	}
	cfg := owner.RecoverConfig{
		Node:         "127.0.0.1:" + strconv.Itoa(port),
		Measurements: policy.Policy{PCRs: measurements.M{11: {Expected: pcr11}, 15: {Expected: make([]byte, 32)}}},
		PlatformCA:   ca.Cert,
		ControlPlane: inst, CACert: clusterCA.Cert.Raw, Endpoint: "10.42.1.100:6443",
	}
	rctx, rcancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer rcancel()
	cfg.MasterSecret, _ = keys.GenerateMasterSecret(rand.Reader)
	if err := owner.Recover(rctx, cfg); !errors.Is(err, owner.ErrWrongMasterSecret) {
		t.Fatalf("recovery with another cluster's master secret = %v, want ErrWrongMasterSecret", err)
	}
	cfg.MasterSecret = ms
	if err := owner.Recover(rctx, cfg); err != nil {
		t.Fatalf("recovery with the cluster's master secret: %v", err)
	}
	console = waitExit(t, v)
	t.Logf("console:\n%s", strings.Join(initLines(console), "\n"))
	for _, want := range []string{"refused a recovery", "state disk opened with the key from the owner", "node locked to cluster", "switch-root"} {
		if !strings.Contains(console, want) {
			t.Errorf("console lacks %q", want)
		}
	}
	checkRecoveredLock(t, console, ms, salt)
}

// checkRecoveredLock checks that the recovered boot's console reports PCR
// 15 extended with the ID of the cluster of ms and salt, and does not
// show the master secret.
func checkRecoveredLock(t *testing.T, console string, ms keys.MasterSecret, salt []byte) {
	t.Helper()
	msec, _ := ms.MeasurementSecret()
	clusterID, err := keys.ClusterID(msec, salt)
	if err != nil {
		t.Fatal(err)
	}
	// PCR 15 as computed here without the code under test: one extend
	// with SHA-256 of the cluster ID.
	d := extend(make([]byte, 32), clusterID)
	if got := rootReports(console, "pcr15"); len(got) != 1 || got[0] != hex.EncodeToString(d) || !bytes.Equal(nodelock.Expected(clusterID), d) {
		t.Errorf("PCR 15 = %q, want %x", got, d)
	}
	for _, secret := range [][]byte{ms.Key, ms.Salt} {
		if strings.Contains(console, hex.EncodeToString(secret)) {
			t.Fatal("the console shows the master secret")
		}
	}
}

// startNetworked boots the fixture's kernel and initrd with its root disk,
// the state disk in dir, a NIC on QEMU's user network netdev (id n0) and a
// vTPM that ca provisioned for inst.
func startNetworked(t *testing.T, f fixture, name, dir, netdev string, ca *platformca.CA, inst attestation.Instance) *vm.VM {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	v, err := vm.Start(ctx, vm.Config{
		Name: name, Dir: dir, Kernel: f.kernel, Initrd: f.initrd,
		Cmdline:      cmdline(f),
		StateDiskMiB: 64,
		ExecPrefix: []string{"/bin/sh", "-c", `exec "$@" -drive if=none,id=rootdisk,format=raw,readonly=on,file=` + f.rootDisk +
			` -device virtio-blk-pci,drive=rootdisk -netdev '` + netdev + `' -device virtio-net-pci,netdev=n0`, "sh"},
		ProvisionTPM: func(rw io.ReadWriter) error {
			_, err := ca.ProvisionAK(rw, inst)
			return err
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { v.Kill() })
	return v
}

// extend is a SHA-256 PCR extend with the digest of data.
func extend(pcr, data []byte) []byte {
	d := sha256.Sum256(data)
	s := sha256.Sum256(append(bytes.Clone(pcr), d[:]...))
	return s[:]
}
