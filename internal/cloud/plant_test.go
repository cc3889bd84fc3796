package cloud_test

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/orrery-dev/orrery/internal/cloud"
)

// plant writes a state file into dir (made with mode) that names nodes
// at the given directories, as a checkout or another user could plant
// an orrery-mini/.
func plant(t *testing.T, dir string, mode os.FileMode, nodeDirs map[string]string) {
	t.Helper()
	if err := os.MkdirAll(dir, mode); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(dir, mode); err != nil {
		t.Fatal(err)
	}
	abs, _ := filepath.Abs(dir)
	st := cloud.State{Phase: cloud.PhaseStopped, Spec: cloud.Spec{Dir: abs}}
	for name, d := range nodeDirs {
		st.Nodes = append(st.Nodes, &cloud.Node{Name: name, Dir: d})
	}
	raw, err := json.Marshal(st)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, cloud.StateFile), raw, 0o600); err != nil {
		t.Fatal(err)
	}
}

// TestPlantedCloudIsNotTrusted: the commands that read a cloud's state
// delete the VMs' directories it names (as root), and take its platform
// CA. A directory others may enter (git makes a checkout's orrery-mini/
// 0755), a link, or a state that names a directory outside the cloud's
// own is refused, and nothing it names is deleted.
func TestPlantedCloudIsNotTrusted(t *testing.T) {
	victim := filepath.Join(t.TempDir(), "home")
	if err := os.MkdirAll(victim, 0o700); err != nil {
		t.Fatal(err)
	}
	base := t.TempDir()

	open := filepath.Join(base, "checkout-mini")
	plant(t, open, 0o755, map[string]string{"cp-0": filepath.Join(open, "cp-0")})
	if _, err := cloud.ReadState(open); !errors.Is(err, cloud.ErrNotOwnDir) {
		t.Errorf("a 0755 cloud directory: %v, want ErrNotOwnDir", err)
	}

	link := filepath.Join(base, "linked-mini")
	own := filepath.Join(base, "own-mini")
	plant(t, own, 0o700, map[string]string{"cp-0": filepath.Join(own, "cp-0")})
	if err := os.Symlink(own, link); err != nil {
		t.Fatal(err)
	}
	if _, err := cloud.ReadState(link); !errors.Is(err, cloud.ErrNotOwnDir) {
		t.Errorf("a linked cloud directory: %v, want ErrNotOwnDir", err)
	}
	if _, err := cloud.ReadState(own); err != nil {
		t.Errorf("the cloud's own directory: %v", err)
	}

	outside := filepath.Join(base, "outside-mini")
	plant(t, outside, 0o700, map[string]string{"cp-0": victim})
	if err := cloud.Cleanup(context.Background(), outside); err == nil {
		t.Error("Cleanup of a state that names a directory outside the cloud succeeded")
	}
	if _, err := os.Stat(victim); err != nil {
		t.Fatalf("Cleanup deleted a directory outside the cloud: %v", err)
	}
	if _, err := cloud.StopDir(context.Background(), open); !errors.Is(err, cloud.ErrNotOwnDir) {
		t.Errorf("stop of a 0755 cloud directory: %v, want ErrNotOwnDir", err)
	}
}
