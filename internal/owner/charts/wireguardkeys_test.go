package charts

import (
	"crypto/rand"
	"encoding/base64"
	"fmt"
	"strings"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

const backendData = "flannel.alpha.coreos.com/backend-data"

// wireGuardKey is a new random WireGuard public key, as flanneld
// publishes it (base64 of 32 bytes).
func wireGuardKey(t *testing.T) string {
	t.Helper()
	b := make([]byte, 32)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return base64.StdEncoding.EncodeToString(b)
}

func backendPatch(t *testing.T, data string) []byte {
	return mergePatch(t, map[string]any{"metadata": map[string]any{"annotations": map[string]any{backendData: data}}})
}

func flannelData(key string) string { return fmt.Sprintf(`{"PublicKey":%q,"Port":51820}`, key) }

// Root on worker-0 holds its kubelet's credential and its flannel token;
// with neither may it publish cp-0's WireGuard key as worker-0's, in
// flanneld's form or another. Its own keys, new or unchanged, it
// publishes as flanneld does. Real API server, the charts' policies.
func TestWireGuardKeysAreTheNodesOwn(t *testing.T) {
	e := newNodePolicyEnv(t)
	waitForPolicies(t, e.worker, "worker-0")
	cpKey := wireGuardKey(t)
	if err := e.patchStatus(e.admin, "cp-0", backendPatch(t, flannelData(cpKey))); err != nil {
		t.Fatalf("cp-0 publishing its key: %v", err)
	}

	// The policy is loaded asynchronously, and its parameters (every
	// Node) after it: dry runs until cp-0's key is refused to worker-0.
	deadline := time.Now().Add(30 * time.Second)
	for {
		_, err := e.flannel.CoreV1().Nodes().Patch(e.ctx, "worker-0", types.MergePatchType, backendPatch(t, flannelData(cpKey)),
			metav1.PatchOptions{DryRun: []string{metav1.DryRunAll}}, "status")
		if apierrors.IsForbidden(err) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("worker-0's flannel may still publish cp-0's key after 30 s: %v", err)
		}
		time.Sleep(100 * time.Millisecond)
	}

	own := wireGuardKey(t)
	for _, tc := range []struct {
		name    string
		write   func() error
		refused string // "" if allowed
	}{
		{"flannel publishes worker-0's key", func() error { return e.patchStatus(e.flannel, "worker-0", backendPatch(t, flannelData(own))) }, ""},
		{"flannel publishes it again", func() error { return e.patchStatus(e.flannel, "worker-0", backendPatch(t, flannelData(own))) }, ""},
		{"flannel publishes a new key of worker-0's", func() error {
			return e.patchStatus(e.flannel, "worker-0", backendPatch(t, flannelData(wireGuardKey(t))))
		}, ""},
		{"flannel publishes cp-0's key", func() error { return e.patchStatus(e.flannel, "worker-0", backendPatch(t, flannelData(cpKey))) }, "WireGuard key of node cp-0"},
		{"kubelet publishes cp-0's key", func() error { return e.patchNode(e.worker, "worker-0", backendPatch(t, flannelData(cpKey))) }, "WireGuard key of node cp-0"},
		{"flannel publishes cp-0's key in another form", func() error {
			return e.patchStatus(e.flannel, "worker-0", backendPatch(t, fmt.Sprintf(`{"Port":51820, "PublicKey":%q}`, cpKey)))
		}, "must be"},
		{"flannel publishes cp-0's key with a field more", func() error {
			return e.patchStatus(e.flannel, "worker-0", backendPatch(t, fmt.Sprintf(`{"PublicKey":%q,"Port":51820,"PublicKeyIPv6":%q}`, own, cpKey)))
		}, "must be"},
	} {
		err := tc.write()
		switch {
		case tc.refused == "" && err != nil:
			t.Errorf("%s: refused: %v", tc.name, err)
		case tc.refused != "" && err == nil:
			t.Errorf("%s: allowed", tc.name)
		case tc.refused != "" && !strings.Contains(err.Error(), tc.refused):
			t.Errorf("%s: %v, want a refusal saying %q", tc.name, err, tc.refused)
		}
	}
}
