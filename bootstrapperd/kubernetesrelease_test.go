package main

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/orrery-dev/orrery/bootstrapperd/internal/kubeadm/kubeadmtest"
	"github.com/orrery-dev/orrery/bootstrapperd/internal/kuberelease"
	"github.com/orrery-dev/orrery/bootstrapperd/internal/kuberelease/kubereleasetest"
	"github.com/orrery-dev/orrery/internal/versions"
)

// A node that boots into its cluster runs the release the join service's
// rejoin ticket named, over what its kept pods say; a recovered control
// plane (no ticket) runs its pods' release; a node told nothing, or told
// a version its image lacks, starts no kubelet.
func TestBootReleaseFollowsTheClusterNotTheDisk(t *testing.T) {
	oldest, newest := versions.List()[0], versions.Default
	pods := kubeadmtest.KeptPods(t, newest)
	noPods := t.TempDir()
	for name, tc := range map[string]struct {
		ticket, pods string
		// chosen is the release this boot's init or join chose.
		chosen string
		want   string
		says   string
	}{
		"this boot's join's choice":           {pods: noPods, chosen: oldest, want: oldest},
		"the ticket's version, not the pods'": {ticket: oldest, pods: pods, want: oldest},
		"a recovered control plane's pods":    {pods: pods, want: newest},
		"a worker told nothing":               {pods: noPods, says: "this node was told no Kubernetes version this boot"},
		"a version the image lacks":           {ticket: "v1.20.0", pods: pods, says: "Kubernetes v1.20.0 is not supported by this image"},
		"a path for a version":                {ticket: "../../../tmp", pods: pods, says: "is not supported by this image"},
	} {
		t.Run(name, func(t *testing.T) {
			node := kubereleasetest.Root(t)
			if tc.chosen != "" {
				if err := node.Activate(tc.chosen); err != nil {
					t.Fatal(err)
				}
			}
			file := filepath.Join(t.TempDir(), "cluster-kubernetes-version")
			if tc.ticket != "" {
				if err := os.WriteFile(file, []byte(tc.ticket), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			var out bytes.Buffer
			err := chooseBootRelease(node, file, tc.pods, &out)
			got, aerr := node.Active()
			if tc.says != "" {
				if err == nil || !strings.Contains(err.Error(), tc.says) || !strings.Contains(err.Error(), "kubelet does not start") {
					t.Fatalf("chooseBootRelease: %v; want it refused saying %q and that kubelet does not start", err, tc.says)
				}
				if !errors.Is(aerr, kuberelease.ErrNone) {
					t.Fatalf("a refused boot chose %q (%v)", got, aerr)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("chooseBootRelease: %v; runs %q (%v), want %s", err, got, aerr, tc.want)
			}
			if !strings.Contains(out.String(), "running Kubernetes "+tc.want) {
				t.Errorf("chooseBootRelease said %q", out.String())
			}
		})
	}
}
