package cmd

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"encoding/hex"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"

	"github.com/orrery-dev/orrery/internal/atls"
	"github.com/orrery-dev/orrery/internal/atls/atlstest"
	"github.com/orrery-dev/orrery/internal/attestation/measurements"
	"github.com/orrery-dev/orrery/internal/attestation/qemu/platformca"
	"github.com/orrery-dev/orrery/internal/attestation/qemu/qemutest"
	"github.com/orrery-dev/orrery/internal/inspectserver"
	"github.com/orrery-dev/orrery/internal/inspectserver/journaltest"
	"github.com/orrery-dev/orrery/internal/keys"
	"github.com/orrery-dev/orrery/internal/owner/workspace"
	"github.com/orrery-dev/orrery/internal/owneraccess"
	"github.com/orrery-dev/orrery/internal/proto/inspectpb"
	"github.com/orrery-dev/orrery/internal/redact"
	"github.com/orrery-dev/orrery/internal/tarfiles"
)

// A secret a pod's or tool's log line could carry, which must not leave
// the node.
const leakedToken = "abcdef.0123456789abcdef"

type oneUnit struct{}

func (oneUnit) Units(context.Context, string) ([]*inspectpb.Unit, error) {
	return []*inspectpb.Unit{{Name: "kubelet.service", LoadState: "loaded", ActiveState: "inactive", SubState: "dead", Description: "kubelet"}}, nil
}

// ownersCluster is the owner's side of a test cluster: a workspace with a
// master secret, and the platform that certifies its nodes.
type ownersCluster struct {
	dir       string
	clusterID []byte
	owner     func() (ed25519.PublicKey, error)
	ca        *platformca.CA
	caFile    string
}

func newOwnersCluster(t *testing.T, dir string) *ownersCluster {
	t.Helper()
	plan, err := workspace.Dir(dir).PlanInit("cp-0", "demo", false)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := plan.Keep(); err != nil {
		t.Fatal(err)
	}
	ms, st := plan.MasterSecret, plan.State
	msec, _ := ms.MeasurementSecret()
	clusterID, _ := keys.ClusterID(msec, st.MeasurementSalt)
	access, _ := ms.OwnerAccessKey()
	c := &ownersCluster{dir: dir, clusterID: clusterID, owner: func() (ed25519.PublicKey, error) { return access.Public().(ed25519.PublicKey), nil }}
	probe := qemutest.NewNode(t)
	c.ca, c.caFile = probe.CA, probe.CAFile(t)
	return c
}

// serveNode runs a node of the cluster, certified as instance name,
// locked to the cluster and serving the inspect service with a real journal
// on listen (HOST:PORT; port 0 picks one). It returns the address.
func (c *ownersCluster) serveNode(t *testing.T, name, listen string) string {
	t.Helper()
	n := qemutest.NewInstance(t, c.ca, platformca.NewInstance(name)).Boot(t, "image-1", "image-1").Lock(t, string(c.clusterID))
	journal := t.TempDir()
	now := time.Now()
	boot := "3798e9c5525f4d6eb22a3dc5cebfef1f"
	journaltest.Write(t, journal, []journaltest.Entry{
		{Time: now.Add(-time.Minute), BootID: boot, Message: "Linux version 6.1", Fields: map[string]string{"_TRANSPORT": "kernel", "SYSLOG_IDENTIFIER": "kernel"}},
		{Time: now.Add(-30 * time.Second), BootID: boot, Message: "kubeadm join --token " + leakedToken, Fields: map[string]string{"_SYSTEMD_UNIT": "bootstrapperd.service", "SYSLOG_IDENTIFIER": "bootstrapperd"}},
		{Time: now.Add(-10 * time.Second), BootID: boot, Message: "kubelet stopped on " + name, Fields: map[string]string{"_SYSTEMD_UNIT": "kubelet.service", "SYSLOG_IDENTIFIER": "kubelet", "_PID": "42"}},
	})
	svc, err := inspectserver.New(inspectserver.Config{
		Owner: c.owner, Journal: inspectserver.Journalctl{Dir: journal}, Units: oneUnit{},
		Status: inspectserver.Host{Stage: "system", ClusterID: func() ([]byte, error) { return c.clusterID, nil }}.Status,
	})
	if err != nil {
		t.Fatal(err)
	}
	return atlstest.ServeAt(t, listen, atls.Config{Issuer: n.Issuer, AuthorizeClient: owneraccess.Authorize(c.owner)},
		func(s *grpc.Server) { inspectpb.RegisterInspectServiceServer(s, svc) })
}

// ownerArgs writes the image's measurements and returns the args that
// name the owner's files.
func (c *ownersCluster) ownerArgs(t *testing.T) []string {
	t.Helper()
	m := measurements.M{}
	for pcr, v := range qemutest.NewNode(t).Boot(t, "image-1", "image-1").PCRs(t) {
		if pcr == 4 || pcr == 9 || pcr == 11 || pcr == 15 {
			m[pcr] = measurements.Measurement{Expected: v}
		}
	}
	raw, _ := m.MarshalJSON()
	mpath := filepath.Join(c.dir, "measurements.json")
	if err := os.WriteFile(mpath, raw, 0o644); err != nil {
		t.Fatal(err)
	}
	return []string{"--master-secret", filepath.Join(c.dir, workspace.MasterSecretFile), "--measurements", mpath, "--platform-ca", c.caFile,
		"--kubeconfig", filepath.Join(c.dir, "none.conf"), "--mini-dir", filepath.Join(c.dir, "no-mini"), "--timeout", "30s"}
}

// runningNode is a node of the owner's cluster: a swtpm node locked to the
// cluster of the workspace in dir, serving the inspect service with a real
// journal. It returns the node's address and the args that name the
// owner's files.
func runningNode(t *testing.T, dir string) (string, []string) {
	t.Helper()
	c := newOwnersCluster(t, dir)
	return c.serveNode(t, "cp-0", "127.0.0.1:0"), c.ownerArgs(t)
}

func TestInspectARunningNode(t *testing.T) {
	dir := t.TempDir()
	addr, owner := runningNode(t, dir)
	cmd := func(args ...string) (string, string, int) { return run(t, "", append(args, owner...)...) }

	out, errOut, code := cmd("verify", addr)
	if code != 0 || !strings.Contains(out, addr+"): OK") || !strings.Contains(out, "image:        "+filepath.Join(dir, "measurements.json")) || !strings.Contains(out, "cluster ID:") {
		t.Fatalf("verify: exit %d\n%s%s", code, out, errOut)
	}
	out, errOut, code = cmd("logs", addr, "kubelet")
	if code != 0 || !strings.Contains(out, "kubelet[42]: kubelet stopped on cp-0") || strings.Contains(out, "bootstrapperd") {
		t.Fatalf("logs kubelet: exit %d\n%s%s", code, out, errOut)
	}
	out, _, _ = cmd("logs", addr)
	if strings.Contains(out, leakedToken) || !strings.Contains(out, "--token "+redact.Redacted) {
		t.Errorf("logs served a bootstrap token:\n%s", out)
	}
	out, errOut, code = cmd("dmesg", addr, "-o", "json")
	if code != 0 || !strings.Contains(out, `"message":"Linux version 6.1"`) {
		t.Fatalf("dmesg: exit %d\n%s%s", code, out, errOut)
	}
	out, errOut, code = cmd("services", addr, "-o", "yaml")
	if code != 0 || !strings.Contains(out, "name: kubelet.service") || !strings.Contains(out, "active: inactive") {
		t.Fatalf("services: exit %d\n%s%s", code, out, errOut)
	}
	checkYAMLMatchesJSON(t, cmd, []string{"services", addr})
	checkYAMLMatchesJSON(t, cmd, []string{"verify", addr})

	bundle := filepath.Join(dir, "support.tar.gz")
	out, errOut, code = cmd("support", addr, "--file", bundle)
	if code != 0 || !strings.Contains(out, "Wrote "+bundle) {
		t.Fatalf("support: exit %d\n%s%s", code, out, errOut)
	}
	f, err := os.Open(bundle)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	files, err := tarfiles.Read(f)
	if err != nil {
		t.Fatal(err)
	}
	nodeDir := "nodes/" + strings.ReplaceAll(addr, ":", "_") + "/"
	if !strings.Contains(files[nodeDir+"journal.log"], "kubelet stopped") || !strings.Contains(files[nodeDir+"kernel.log"], "Linux version") {
		t.Errorf("the bundle lacks the node's journal or kernel log; it has %v", tarfiles.Names(files))
	}
	if !strings.Contains(files["cluster/ERROR.txt"], "API server") {
		t.Errorf("the bundle does not say why the cluster's state is missing: %v", tarfiles.Names(files))
	}
	ms, _ := keys.ReadMasterSecretFile(filepath.Join(dir, workspace.MasterSecretFile))
	for name, content := range files {
		for _, secret := range []string{leakedToken, string(ms.Key), hex.EncodeToString(ms.Key)} {
			if strings.Contains(content, secret) {
				t.Errorf("bundle file %s holds a secret", name)
			}
		}
	}
}

func TestInspectRefusesWhatIsNotTheOwners(t *testing.T) {
	dir := t.TempDir()
	addr, owner := runningNode(t, dir)

	// Another cluster's owner: another master secret, so another access
	// key. The node refuses before it quotes.
	_, otherOwner := runningNode(t, t.TempDir())
	_, errOut, code := run(t, "", append([]string{"logs", addr}, otherOwner...)...)
	if code == 0 || !strings.Contains(errOut, "refused this client") || !strings.Contains(errOut, "answers only its owner") {
		t.Errorf("logs as another cluster's owner: exit %d, %s", code, errOut)
	}

	// The owner's key but another cluster ID (a state file from another
	// cluster): the node answers, and the owner's side refuses its lock.
	st, _ := workspace.Dir(dir).ReadState()
	st.MeasurementSalt = bytes.Repeat([]byte{1}, 32)
	if err := workspace.Dir(dir).WriteState(st); err != nil {
		t.Fatal(err)
	}
	out, errOut, code := run(t, "", append([]string{"verify", addr}, owner...)...)
	if code == 0 || !strings.Contains(out, "REFUSED") || !strings.Contains(out, "not locked to this cluster (PCR 15 differs)") {
		t.Errorf("verify of a node locked to another cluster: exit %d\n%s%s", code, out, errOut)
	}

	_, errOut, code = run(t, "", append([]string{"logs", "no-such-node"}, owner...)...)
	if code == 0 || !strings.Contains(errOut, "name the nodes by address") {
		t.Errorf("a name without an API server or mini: exit %d, %s", code, errOut)
	}
}

// A node that takes the connection but never answers (one still starting
// its node service) is reported as not answering in time, with what to
// do, not as a refusal of what it said.
func TestVerifySaysWhenANodeDidNotAnswer(t *testing.T) {
	_, owner := runningNode(t, t.TempDir())
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	go func() {
		var held []net.Conn
		defer func() {
			for _, c := range held {
				c.Close()
			}
		}()
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			held = append(held, c)
		}
	}()
	out, errOut, code := run(t, "", append([]string{"verify", l.Addr().String()}, append(owner, "--timeout", "2s")...)...)
	if code == 0 || !strings.Contains(out, "REFUSED: "+l.Addr().String()+" did not answer within 2s: run the command again, or pass a longer --timeout") {
		t.Errorf("verify of a silent node: exit %d\n%s%s", code, out, errOut)
	}
}
