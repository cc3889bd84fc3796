package workspace

import (
	"crypto/rand"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"time"

	"github.com/orrery-dev/orrery/internal/keys"
)

// InitPlan is what an init starts from: the secrets it sends and where a
// run of the same init in this workspace left off.
type InitPlan struct {
	MasterSecret keys.MasterSecret
	State        State
	// Stage says how far an earlier run of this init got.
	Stage InitStage

	dir Dir
	// replaces says that Keep sets an earlier init's files aside.
	replaces bool
}

// InitStage is how far an init in a workspace got.
type InitStage int

const (
	// InitNew: the workspace holds no init; the secrets are new and
	// nothing is written until Keep.
	InitNew InitStage = iota
	// InitInterrupted: an init of the same node and cluster did not
	// finish; it is resumed with the secrets it sent.
	InitInterrupted
	// InitDone: kubeadm init finished on the node (the state has the
	// cluster ID and the kubeconfig is here); only the cluster services
	// may be left to install.
	InitDone
)

// PlanInit reads the workspace for an init of clusterName on node
// (HOST:PORT). It writes nothing. A workspace that holds another init,
// or a master secret without its state, is refused: a second cluster must
// never share the first one's master secret. With replace, such a
// workspace is planned as a new one whose old files Keep sets aside.
func (d Dir) PlanInit(node, clusterName string, replace bool) (InitPlan, error) {
	plan, err := d.planInit(node, clusterName)
	if err == nil || !replace {
		return plan, err
	}
	return d.PlanReplacement(node, clusterName)
}

// PlanReplacement plans a new init in a workspace whose files are an
// earlier init's, of a cluster that is gone: Keep sets them aside.
func (d Dir) PlanReplacement(node, clusterName string) (InitPlan, error) {
	plan, err := d.newPlan(node, clusterName)
	plan.replaces = true
	return plan, err
}

func (d Dir) planInit(node, clusterName string) (InitPlan, error) {
	plan := InitPlan{dir: d}
	ms, msErr := keys.ReadMasterSecretFile(d.Path(MasterSecretFile))
	st, stErr := d.ReadState()
	msMissing, stMissing := errors.Is(msErr, fs.ErrNotExist), errors.Is(stErr, fs.ErrNotExist)
	switch {
	case msMissing && stMissing:
		return d.newPlan(node, clusterName)
	case msErr != nil && !msMissing:
		return plan, msErr
	case stErr != nil && !stMissing:
		return plan, stErr
	case stMissing:
		return plan, fmt.Errorf("%s holds a master secret (%s) but no %s: it may be another cluster's, and a new cluster must not share it. "+
			"Init in another workspace (--workspace DIR), or set the old files aside with --replace-workspace", d, MasterSecretFile, StateFile)
	case msMissing:
		return plan, fmt.Errorf("%s holds %s but not the master secret %s it belongs with: restore the master secret from your backup, "+
			"or init in another workspace (--workspace DIR)", d, StateFile, MasterSecretFile)
	}
	plan.MasterSecret, plan.State = ms, st
	if st.Node != node || st.ClusterName != clusterName {
		return plan, fmt.Errorf("%s holds %s: this init is of cluster %q on %s. "+
			"Init the new cluster in another workspace (--workspace DIR), or set the old files aside with --replace-workspace",
			d, st.describe(), clusterName, node)
	}
	plan.Stage = InitInterrupted
	if len(st.ClusterID) > 0 {
		if _, err := os.Stat(d.Path(KubeconfigFile)); err != nil {
			return plan, fmt.Errorf("%s holds %s, but its kubeconfig %s is missing: restore it from your backup", d, st.describe(), KubeconfigFile)
		}
		plan.Stage = InitDone
	}
	return plan, nil
}

func (d Dir) newPlan(node, clusterName string) (InitPlan, error) {
	ms, err := keys.GenerateMasterSecret(rand.Reader)
	if err != nil {
		return InitPlan{}, err
	}
	salt, err := keys.GenerateSalt(rand.Reader)
	if err != nil {
		return InitPlan{}, err
	}
	return InitPlan{MasterSecret: ms, State: State{Node: node, ClusterName: clusterName, MeasurementSalt: salt}, dir: d}, nil
}

// describe names the init a state belongs to, for messages.
func (st State) describe() string {
	if len(st.ClusterID) == 0 {
		return fmt.Sprintf("an init of cluster %q on %s that did not finish", st.ClusterName, st.Node)
	}
	return fmt.Sprintf("the cluster %q (ID %x) initialised on %s", st.ClusterName, st.ClusterID, st.Node)
}

// Kept is what Keep did.
type Kept struct {
	// Wrote says that a new master secret and state were written.
	Wrote bool
	// SetAside is where an earlier init's files went, if anywhere.
	SetAside string
}

// Keep writes a new plan's master secret and state, each 0600 in a 0700
// directory, after setting an earlier init's files aside if the plan
// replaces them. An init calls it once the node has attested and before
// it sends the secrets: the node locks itself to them, so they must be on
// disk first.
func (p InitPlan) Keep() (Kept, error) {
	var k Kept
	if p.Stage != InitNew {
		return k, nil
	}
	if err := p.dir.Create(); err != nil {
		return k, err
	}
	if p.replaces {
		aside, err := p.dir.SetAside(time.Now())
		if err != nil {
			return k, err
		}
		k.SetAside = aside
	}
	if err := keys.WriteMasterSecretFile(p.dir.Path(MasterSecretFile), p.MasterSecret); err != nil {
		return k, err
	}
	k.Wrote = true
	return k, p.dir.WriteState(p.State)
}

// initFiles are the files an init leaves in a workspace.
var initFiles = []string{MasterSecretFile, StateFile, KubeconfigFile, JournalFile, KubeadmLogFile}

// SetAside moves an earlier init's files into a new directory in the
// workspace named for now, and returns its path, or "" if there were none.
// Nothing is deleted: an old cluster's master secret is its only way to
// recover its disks.
func (d Dir) SetAside(now time.Time) (string, error) {
	var present []string
	for _, f := range initFiles {
		if _, err := os.Lstat(d.Path(f)); err == nil {
			present = append(present, f)
		}
	}
	if len(present) == 0 {
		return "", nil
	}
	aside := d.Path("orrery-replaced-" + now.UTC().Format("20060102T150405Z"))
	if err := os.Mkdir(aside, 0o700); err != nil {
		return "", fmt.Errorf("set the old init's files aside: %w", err)
	}
	for _, f := range present {
		if err := os.Rename(d.Path(f), filepath.Join(aside, f)); err != nil {
			return "", fmt.Errorf("set %s aside: %w", f, err)
		}
	}
	return aside, nil
}
