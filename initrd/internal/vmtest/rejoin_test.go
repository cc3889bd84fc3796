package vmtest

import (
	"bytes"
	"crypto/rand"
	"encoding/base64"
	"encoding/hex"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/orrery-dev/orrery/internal/attestation"
	"github.com/orrery-dev/orrery/internal/attestation/measurements"
	"github.com/orrery-dev/orrery/internal/attestation/qemu/platformca"
	"github.com/orrery-dev/orrery/internal/attestation/qemu/qemutest"
	"github.com/orrery-dev/orrery/internal/cloud/vm"
	"github.com/orrery-dev/orrery/internal/keys"
	"github.com/orrery-dev/orrery/internal/metadata"
	"github.com/orrery-dev/orrery/internal/nodelock"
	"github.com/orrery-dev/orrery/internal/role"
	"github.com/orrery-dev/orrery/joinservice/joinservicetest"
)

// TestRejoinInTheInitrd boots a worker whose state disk belongs to a
// cluster, with two control planes in the metadata service: the first
// runs the join service of another cluster of the same image, whose key
// does not open the disk; the second is the node's own cluster. Both are
// the real join server over attested TLS, on host vTPMs that show the
// VM's firmware measurements (replayed from its own first boot), the same
// initrd phases and a node lock, as control planes of this image would.
// The node must refuse the first key with the disk untouched, open the
// disk with the second, and lock itself to its cluster.
func TestRejoinInTheInitrd(t *testing.T) {
	f := setup(t)
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	ca, err := platformca.New("test platform CA")
	if err != nil {
		t.Fatal(err)
	}
	self := platformca.NewInstance("worker-0")
	dir := filepath.Join(t.TempDir(), "vm")
	meta := serveMetadata(t, []metadata.Instance{
		{Name: "worker-0", Role: role.Worker, IP: netip.MustParseAddr("127.0.0.1")},
		{Name: "cp-0", Role: role.ControlPlane, IP: netip.MustParseAddr("169.254.169.5")},
		{Name: "cp-1", Role: role.ControlPlane, IP: netip.MustParseAddr("169.254.169.6")},
	})
	forward := func(guest, host string) string {
		return ",guestfwd=tcp:" + guest + "-cmd:env " + pipeEnv + "=" + host + " " + exe
	}
	start := func(name string, routes string) *vm.VM {
		netdev := "user,id=n0,net=169.254.169.0/24,dhcpstart=169.254.169.15" + forward("169.254.169.254:80", meta) + routes
		return startNetworked(t, f, name, dir, netdev, ca, self)
	}

	// First boot, on the same VM and devices: the initrd formats the
	// state disk, and the test root reports the firmware's event log,
	// which the control planes' vTPMs replay.
	console := waitExit(t, start("initrd-rejoin-first", ""))
	logs := rootReports(console, "fwlog")
	if len(logs) != 1 {
		t.Fatalf("the test root reported %d firmware event logs, want 1\n%s", len(logs), consoleReport(console))
	}
	fwlog, err := base64.StdEncoding.DecodeString(logs[0])
	if err != nil {
		t.Fatal(err)
	}

	// The node joined its cluster since: its disk is that cluster's.
	ms, err := keys.GenerateMasterSecret(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	uuid, salt := joinCluster(t, dir, console, ms)

	pcr11 := make([]byte, 32)
	for _, marker := range []string{"enter-initrd", "leave-initrd"} {
		pcr11 = extend(pcr11, []byte(marker))
	}
	admitted := map[string]attestation.Instance{uuid: self}
	controlPlane := func(name, cluster string) attestation.Issuer {
		n := qemutest.NewInstance(t, ca, platformca.NewInstance(name)).Firmware(t, fwlog)
		n.Measure(t, 11, "enter-initrd", "initrd: enter-initrd")
		n.Measure(t, 11, "leave-initrd", "initrd: leave-initrd")
		return n.Lock(t, cluster).Issuer
	}
	otherMS, err := keys.GenerateMasterSecret(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	nodes := measurements.M{11: {Expected: pcr11}, 15: {Expected: make([]byte, 32)}}
	other := joinservicetest.Serve(t, joinservicetest.Config{
		Identity: controlPlane("cp-0", "another cluster"), PlatformCA: ca.Cert, Measurements: nodes,
		MasterSecret: otherMS, MeasurementSalt: salt, Admitted: admitted,
	})
	own := joinservicetest.Serve(t, joinservicetest.Config{
		Identity: controlPlane("cp-1", "this cluster"), PlatformCA: ca.Cert, Measurements: nodes,
		MasterSecret: ms, MeasurementSalt: salt, Admitted: admitted,
	})
	join := ":" + strconv.Itoa(30090)
	v := start("initrd-rejoin", forward("169.254.169.5"+join, other)+forward("169.254.169.6"+join, own))
	console = waitExit(t, v)
	t.Logf("console:\n%s", strings.Join(initLines(console), "\n"))
	for _, want := range []string{
		"the join service at 169.254.169.5:30090 gave a key that does not open the state disk",
		"state disk opened with the key from the join service at 169.254.169.6:30090",
		"node locked to cluster", "switch-root", "ORRERY-ROOT done",
	} {
		if !strings.Contains(console, want) {
			t.Errorf("console lacks %q", want)
		}
	}
	msec, err := ms.MeasurementSecret()
	if err != nil {
		t.Fatal(err)
	}
	clusterID, err := keys.ClusterID(msec, salt)
	if err != nil {
		t.Fatal(err)
	}
	// PCR 15 computed here without the code under test.
	d := extend(make([]byte, 32), clusterID)
	if got := rootReports(console, "pcr15"); len(got) != 1 || got[0] != hex.EncodeToString(d) || !bytes.Equal(nodelock.Expected(clusterID), d) {
		t.Errorf("PCR 15 = %q, want %x", got, d)
	}
	for _, m := range []keys.MasterSecret{ms, otherMS} {
		for _, secret := range [][]byte{m.Key, m.Salt, msec} {
			if strings.Contains(console, hex.EncodeToString(secret)) {
				t.Fatal("the console shows a secret")
			}
		}
	}
}
