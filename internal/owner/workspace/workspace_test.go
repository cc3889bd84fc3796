package workspace

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// A new workspace's plan writes nothing until Keep, and then the master
// secret and state, for no one else to read.
func TestPlanInitWritesOnlyOnKeep(t *testing.T) {
	d := Dir(filepath.Join(t.TempDir(), "owner"))
	plan, err := d.PlanInit("10.0.0.1:9000", "demo", false)
	if err != nil || plan.Stage != InitNew || len(plan.State.MeasurementSalt) == 0 {
		t.Fatalf("plan %+v, %v; want a new one with a salt", plan.Stage, err)
	}
	if _, err := os.Stat(string(d)); err == nil {
		t.Fatal("PlanInit created the workspace")
	}
	if kept, err := plan.Keep(); err != nil || !kept.Wrote {
		t.Fatalf("Keep: %+v, %v", kept, err)
	}
	for _, p := range []string{string(d), d.Path(MasterSecretFile), d.Path(StateFile)} {
		st, err := os.Stat(p)
		if err != nil || st.Mode().Perm()&0o077 != 0 {
			t.Errorf("%s: %v, %v; want no access for others", p, st, err)
		}
	}
	again, err := d.PlanInit("10.0.0.1:9000", "demo", false)
	if err != nil || again.Stage != InitInterrupted || !bytes.Equal(again.MasterSecret.Key, plan.MasterSecret.Key) || !bytes.Equal(again.State.MeasurementSalt, plan.State.MeasurementSalt) {
		t.Fatalf("second plan: stage %v, same secrets %v, %v; want the first init resumed", again.Stage, bytes.Equal(again.MasterSecret.Key, plan.MasterSecret.Key), err)
	}
	if kept, err := again.Keep(); err != nil || kept.Wrote {
		t.Fatalf("Keep of a resumed plan: %+v, %v", kept, err)
	}
	if _, err := os.Stat(d.Path(StateFile) + ".tmp"); err == nil {
		t.Error("a temporary file is left behind")
	}
}

// A workspace that holds another init is refused, so that two clusters
// never share a master secret; set aside, it starts over.
func TestPlanInitRefusesAnotherInit(t *testing.T) {
	d := Dir(t.TempDir())
	plan, err := d.PlanInit("10.0.0.1:9000", "demo", false)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := plan.Keep(); err != nil {
		t.Fatal(err)
	}
	for name, tc := range map[string]struct{ node, cluster string }{
		"another node":    {"10.0.0.2:9000", "demo"},
		"another cluster": {"10.0.0.1:9000", "other"},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := d.PlanInit(tc.node, tc.cluster, false)
			if err == nil || !strings.Contains(err.Error(), `an init of cluster "demo" on 10.0.0.1:9000 that did not finish`) || !strings.Contains(err.Error(), "--workspace") {
				t.Fatalf("err %v; want a refusal naming the earlier init and what to do", err)
			}
		})
	}
	plan.State.ClusterID = []byte{1, 2}
	if err := d.WriteState(plan.State); err != nil {
		t.Fatal(err)
	}
	if _, err := d.PlanInit("10.0.0.1:9000", "demo", false); err == nil || !strings.Contains(err.Error(), "kubeconfig") {
		t.Fatalf("a finished init without its kubeconfig: %v; want a refusal", err)
	}
	if _, err := d.WriteKubeconfig([]byte("apiVersion: v1\n")); err != nil {
		t.Fatal(err)
	}
	if done, err := d.PlanInit("10.0.0.1:9000", "demo", false); err != nil || done.Stage != InitDone {
		t.Fatalf("stage %v, %v; want the finished init", done.Stage, err)
	}
	aside, err := d.SetAside(time.Date(2026, 11, 28, 12, 0, 0, 0, time.UTC))
	if err != nil || filepath.Base(aside) != "orrery-replaced-20261128T120000Z" {
		t.Fatalf("SetAside: %q, %v", aside, err)
	}
	for _, f := range []string{MasterSecretFile, StateFile, KubeconfigFile} {
		if _, err := os.Stat(filepath.Join(aside, f)); err != nil {
			t.Errorf("%s was not set aside: %v", f, err)
		}
	}
	if fresh, err := d.PlanInit("10.0.0.2:9000", "other", false); err != nil || fresh.Stage != InitNew || bytes.Equal(fresh.MasterSecret.Key, plan.MasterSecret.Key) {
		t.Fatalf("after SetAside: stage %v, %v; want a new init with a new master secret", fresh.Stage, err)
	}
}

// A master secret without its state may be another cluster's: refused.
func TestPlanInitRefusesALoneMasterSecret(t *testing.T) {
	d := Dir(t.TempDir())
	plan, err := d.PlanInit("n:1", "c", false)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := plan.Keep(); err != nil {
		t.Fatal(err)
	}
	os.Remove(d.Path(StateFile))
	if _, err := d.PlanInit("n:1", "c", false); err == nil || !strings.Contains(err.Error(), "--replace-workspace") {
		t.Fatalf("err %v; want a refusal that says what to do", err)
	}
}

// A damaged state file is never replaced by a new one: its salt is the
// only way to compute the cluster ID again.
func TestDamagedStateIsNotReplaced(t *testing.T) {
	for name, content := range map[string]string{
		"truncated": `{"node": "10.0.0.1:9000", "measurementSa`,
		"no salt":   `{"node": "10.0.0.1:9000"}`,
		"garbage":   "\x00\x01",
	} {
		t.Run(name, func(t *testing.T) {
			d := Dir(t.TempDir())
			if err := os.WriteFile(d.Path(StateFile), []byte(content), 0o600); err != nil {
				t.Fatal(err)
			}
			_, err := d.PlanInit("n", "c", false)
			if err == nil || !strings.Contains(err.Error(), "restore it from a backup") {
				t.Fatalf("err %v; want one that says to restore the file", err)
			}
			if got, _ := os.ReadFile(d.Path(StateFile)); string(got) != content {
				t.Fatal("the damaged file was overwritten")
			}
		})
	}
}

// Told to, an init plans a new cluster over another init's files and sets
// them aside only when it keeps its own.
func TestPlanInitReplaces(t *testing.T) {
	d := Dir(t.TempDir())
	old, err := d.PlanInit("10.0.0.1:9000", "demo", false)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := old.Keep(); err != nil {
		t.Fatal(err)
	}
	plan, err := d.PlanInit("10.0.0.2:9000", "next", true)
	if err != nil || plan.Stage != InitNew || bytes.Equal(plan.MasterSecret.Key, old.MasterSecret.Key) {
		t.Fatalf("stage %v, %v; want a new init with its own master secret", plan.Stage, err)
	}
	if st, _ := d.ReadState(); st.ClusterName != "demo" {
		t.Fatal("planning touched the old init's files")
	}
	kept, err := plan.Keep()
	if err != nil || !kept.Wrote || kept.SetAside == "" {
		t.Fatalf("Keep: %+v, %v", kept, err)
	}
	if st, err := Dir(kept.SetAside).ReadState(); err != nil || st.ClusterName != "demo" {
		t.Fatalf("the old state was not set aside: %+v, %v", st, err)
	}
	if st, err := d.ReadState(); err != nil || st.ClusterName != "next" {
		t.Fatalf("the new state: %+v, %v", st, err)
	}
}

// TestPlantedLinksAreNotFollowed is a workspace in a checkout or shared
// directory where someone planted links under the workspace's names, to
// the master secret: writing the admin kubeconfig, a saved log or the
// upgrade log must not write through them, and reading the state must not
// read through one.
func TestPlantedLinksAreNotFollowed(t *testing.T) {
	d := Dir(t.TempDir())
	secret := d.Path("the-real-secret")
	const content = "the owner's master secret"
	if err := os.WriteFile(secret, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{KubeconfigFile, JournalFile, UpgradeLogFile, KubeconfigFile + ".tmp", StateFile} {
		if err := os.Symlink(secret, d.Path(name)); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := d.ReadState(); !errors.Is(err, ErrNotRegular) {
		t.Errorf("ReadState through a link = %v, want ErrNotRegular", err)
	}
	if _, err := d.ReadFile(JournalFile); !errors.Is(err, ErrNotRegular) {
		t.Errorf("ReadFile through a link = %v, want ErrNotRegular", err)
	}
	if _, err := d.WriteKubeconfig([]byte("apiVersion: v1\n")); err != nil {
		t.Fatal(err)
	}
	if _, err := d.Save(JournalFile, []byte("a log")); err != nil {
		t.Fatal(err)
	}
	f, err := d.CreateLog(UpgradeLogFile)
	if err != nil {
		t.Fatal(err)
	}
	f.WriteString("an upgrade's log")
	f.Close()
	if got, err := os.ReadFile(secret); err != nil || string(got) != content {
		t.Fatalf("the link's target now holds %q (%v): a write went through a planted link", got, err)
	}
	for _, name := range []string{KubeconfigFile, JournalFile, UpgradeLogFile} {
		if err := d.CheckRegular(name); err != nil {
			t.Errorf("%s after writing: %v, want a regular file of its own", name, err)
		}
	}
}

// The control planes recover counts and trusts follow approvals and
// removals, the first node's included.
func TestControlPlanesFollowApprovalsAndRemovals(t *testing.T) {
	d := Dir(filepath.Join(t.TempDir(), "owner"))
	if err := d.RecordControlPlane("5150", true); err == nil {
		t.Error("a workspace without a state file recorded an approval without saying it could not")
	}
	plan, err := d.PlanInit("10.0.0.1:9000", "demo", false)
	if err != nil {
		t.Fatal(err)
	}
	plan.State.FirstNode = &FirstNode{Name: "cp-0", InstanceID: "4242"}
	if _, err := plan.Keep(); err != nil {
		t.Fatal(err)
	}
	count := func() int {
		t.Helper()
		st, err := d.ReadState()
		if err != nil {
			t.Fatal(err)
		}
		return st.ControlPlaneCount()
	}
	for _, id := range []string{"5150", "5151", "5150"} {
		if err := d.RecordControlPlane(id, true); err != nil {
			t.Fatal(err)
		}
	}
	if n := count(); n != 3 {
		t.Errorf("the first node and two approved: %d control planes", n)
	}
	if err := d.RecordRemoved("cp-1", []string{"5151"}); err != nil || count() != 2 {
		t.Errorf("after cp-1's removal: %d control planes, %v; want 2", count(), err)
	}
	// The first node goes by its name even if no record named its
	// instance.
	if err := d.RecordRemoved("cp-0", nil); err != nil || count() != 1 {
		t.Errorf("after cp-0's removal: %d control planes, %v; want 1", count(), err)
	}
	st, _ := d.ReadState()
	if st.FirstNode == nil || !st.FirstNode.Removed || st.FirstNode.InstanceID != "4242" || len(st.ControlPlanes) != 1 || st.ControlPlanes[0] != "5150" {
		t.Errorf("state after the removals: first node %+v, approved %v", st.FirstNode, st.ControlPlanes)
	}
}
