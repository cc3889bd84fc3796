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
//
// It is also the test of what a node keeps: the first boot plants, as
// root on a node would, files in /etc and /etc/kubernetes that would run
// or be trusted at the next boot; the rejoin must come up without any of
// them (the cluster CA rewritten from the join service's ticket), with
// the same machine ID. The rejoined boot then changes kubelet's flags on
// the state disk, and a third boot must refuse to start the OS.
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
	first := waitExit(t, start("initrd-rejoin-first", ""))
	console := first
	fwlog := firmwareLog(t, console)

	// The node joined its cluster since: its disk is that cluster's.
	ms, err := keys.GenerateMasterSecret(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	uuid, salt := joinCluster(t, dir, console, ms)

	cps := serveRejoinClusters(t, ca, self, fwlog, ms, uuid, salt)
	join := ":" + strconv.Itoa(30090)
	routes := forward("169.254.169.5"+join, cps.other) + forward("169.254.169.6"+join, cps.own)
	// The hypervisor operator keeps a copy of the state disk as it is
	// before the rejoin, to swap in later.
	stateDisk := filepath.Join(dir, vm.StateFile)
	older := filepath.Join(t.TempDir(), "state-before-rejoin.qcow2")
	copyFile(t, stateDisk, older)
	v := start("initrd-rejoin", routes)
	console = waitExit(t, v)
	t.Logf("console:\n%s", strings.Join(initLines(console), "\n"))
	checkRejoinedBoot(t, first, console)

	// The rejoined OS changed kubelet's flags: refused at the next boot,
	// before the OS starts, with what to do.
	if planted := rootReports(console, "planted"); len(planted) != 1 {
		t.Fatalf("the rejoined boot planted %q", planted)
	}
	checkRefusedBoot(t, waitExit(t, start("initrd-rejoin-refused", routes)))

	// The copy from before the rejoin, swapped in: it opens with the same
	// key, but its generation is older than the cluster's record.
	copyFile(t, older, stateDisk)
	checkRolledBackBoot(t, waitExit(t, start("initrd-rejoin-rolled-back", routes)))

	checkLockedWithoutSecrets(t, console, cps.clusterID, []keys.MasterSecret{ms, cps.otherMS}, cps.msec)
}

// firmwareLog returns the firmware event log the test root reported on
// the first boot's console.
func firmwareLog(t *testing.T, console string) []byte {
	t.Helper()
	logs := rootReports(console, "fwlog")
	if len(logs) != 1 {
		t.Fatalf("the test root reported %d firmware event logs, want 1\n%s", len(logs), consoleReport(console))
	}
	fwlog, err := base64.StdEncoding.DecodeString(logs[0])
	if err != nil {
		t.Fatal(err)
	}
	return fwlog
}

// rejoinClusters are the two join services TestRejoinInTheInitrd's node
// asks, and the secrets of their clusters.
type rejoinClusters struct {
	other, own string // addresses of the join services of cp-0 and cp-1
	otherMS    keys.MasterSecret
	msec       []byte // the node's cluster's measurement secret
	clusterID  []byte // the node's cluster's ID
}

// serveRejoinClusters serves the join services of cp-0, of another
// cluster of the same image, and cp-1, of the node's own cluster (master
// secret ms), on host vTPMs that replay the node's firmware log fwlog
// and initrd phases. Both admit the node (self) with the disk uuid.
func serveRejoinClusters(t *testing.T, ca *platformca.CA, self attestation.Instance, fwlog []byte,
	ms keys.MasterSecret, uuid string, salt []byte,
) rejoinClusters {
	t.Helper()
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
	msec, err := ms.MeasurementSecret()
	if err != nil {
		t.Fatal(err)
	}
	clusterID, err := keys.ClusterID(msec, salt)
	if err != nil {
		t.Fatal(err)
	}
	nodes := measurements.M{11: {Expected: pcr11}, 15: {Expected: make([]byte, 32)}}
	other := joinservicetest.Serve(t, joinservicetest.Config{
		Identity: controlPlane("cp-0", "another cluster"), PlatformCA: ca.Cert, Measurements: nodes,
		MasterSecret: otherMS, MeasurementSalt: salt, Admitted: admitted,
	})
	own := joinservicetest.Serve(t, joinservicetest.Config{
		// Locked to the node's cluster: the node checks its disk's
		// generation only with a join service of its own cluster.
		Identity: controlPlane("cp-1", string(clusterID)), PlatformCA: ca.Cert, Measurements: nodes,
		MasterSecret: ms, MeasurementSalt: salt, Admitted: admitted,
	})
	return rejoinClusters{other: other, own: own, otherMS: otherMS, msec: msec, clusterID: clusterID}
}

// checkRejoinedBoot checks the console of the rejoin: the other
// cluster's key refused, the disk opened with the own cluster's, the
// files the first boot planted gone, the cluster CA rewritten and the
// machine ID kept.
func checkRejoinedBoot(t *testing.T, first, console string) {
	t.Helper()
	for _, want := range []string{
		"the join service at 169.254.169.5:30090 gave a key that does not open the state disk",
		"state disk opened with the key from the join service at 169.254.169.6:30090",
		"state disk generation 1 recorded by the join service at 169.254.169.6:30090 (the disk held 0)",
		"node locked to cluster", "switch-root", "ORRERY-ROOT done",
	} {
		if !strings.Contains(console, want) {
			t.Errorf("console lacks %q", want)
		}
	}
	if planted := rootReports(first, "planted"); len(planted) != 1 {
		t.Errorf("the first boot planted %q\n%s", planted, consoleReport(first))
	}
	if kept := rootReports(console, "kept"); len(kept) > 0 || len(rootReports(console, "gone")) != 6 {
		t.Errorf("after a reboot, the planted files %q are still there (gone: %q)", kept, rootReports(console, "gone"))
	}
	if ca := rootReports(console, "cacert"); len(ca) != 1 || ca[0] != "kubernetes" {
		t.Errorf("the cluster CA certificate after the rejoin: %q, want the join service's (CN kubernetes)", ca)
	}
	if id, first := rootReports(console, "machineid"), rootReports(first, "machineid"); len(id) != 1 || len(first) != 1 || id[0] != first[0] || len(id[0]) != 32 {
		t.Errorf("machine ID: first boot %q, rejoin %q; want one ID, kept", first, id)
	}
	for _, want := range []string{"removed /etc/kubernetes/manifests: not a file kubeadm keeps on a worker",
		"removed /etc/kubernetes/kubelet.conf.d", "rewrote /etc/kubernetes/pki/ca.crt from the join service's ticket"} {
		if !strings.Contains(console, want) {
			t.Errorf("console lacks %q", want)
		}
	}
}

// checkRefusedBoot checks the console of the boot after the rejoined OS
// changed kubelet's flags: refused, with what to do, before the OS starts.
func checkRefusedBoot(t *testing.T, refusedBoot string) {
	t.Helper()
	for _, want := range []string{"refusing what the state disk keeps: /var/lib/kubelet/kubeadm-flags.env gives kubelet \"--config-dir=/var/lib/kubelet/conf.d\"",
		"orrery node remove"} {
		if !strings.Contains(refusedBoot, want) {
			t.Errorf("the third boot's console lacks %q\n%s", want, consoleReport(refusedBoot))
		}
	}
	if strings.Contains(refusedBoot, "ORRERY-ROOT pid") {
		t.Error("the OS started on a disk whose kubelet flags were changed")
	}
}

// checkRolledBackBoot checks the console of the boot on the copy of the
// state disk from before the rejoin: refused as an older copy.
func checkRolledBackBoot(t *testing.T, rolledBack string) {
	t.Helper()
	for _, want := range []string{"presents generation 0", "older copy of the disk"} {
		if !strings.Contains(rolledBack, want) {
			t.Errorf("the rolled-back boot's console lacks %q\n%s", want, consoleReport(rolledBack))
		}
	}
	if strings.Contains(rolledBack, "ORRERY-ROOT pid") || strings.Contains(rolledBack, "node locked to cluster") {
		t.Error("the node booted on an older copy of its state disk")
	}
}

// checkLockedWithoutSecrets checks that the rejoin's console reports PCR
// 15 extended with clusterID and shows none of the master secrets mss
// nor the measurement secret msec.
func checkLockedWithoutSecrets(t *testing.T, console string, clusterID []byte, mss []keys.MasterSecret, msec []byte) {
	t.Helper()
	// PCR 15 computed here without the code under test.
	d := extend(make([]byte, 32), clusterID)
	if got := rootReports(console, "pcr15"); len(got) != 1 || got[0] != hex.EncodeToString(d) || !bytes.Equal(nodelock.Expected(clusterID), d) {
		t.Errorf("PCR 15 = %q, want %x", got, d)
	}
	for _, m := range mss {
		for _, secret := range [][]byte{m.Key, m.Salt, msec} {
			if strings.Contains(console, hex.EncodeToString(secret)) {
				t.Fatal("the console shows a secret")
			}
		}
	}
}

// copyFile copies a disk image, as the host copies a VM's disk.
func copyFile(t *testing.T, from, to string) {
	t.Helper()
	b, err := os.ReadFile(from)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(to, b, 0o600); err != nil {
		t.Fatal(err)
	}
}
