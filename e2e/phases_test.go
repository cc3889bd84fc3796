//go:build e2e

package e2e

import (
	"testing"
	"time"
)

func TestInitSteps(t *testing.T) {
	out := "Initialising\n  [   0.9s] node locked\nTime per step:\n    node locked to the new cluster  0s\n" +
		"    orrery-images                   2m8.5s\n    kubeadm wait-control-plane      41.2s\nDone in 4m2s. Kubeconfig: x\n"
	got := initSteps(out)
	want := []phase{{"  init: node locked to the new cluster", 0}, {"  init: orrery-images", 128500 * time.Millisecond},
		{"  init: kubeadm wait-control-plane", 41200 * time.Millisecond}}
	if len(got) != len(want) {
		t.Fatalf("initSteps = %v, want %v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("row %d = %v, want %v", i, got[i], want[i])
		}
	}
	if initSteps("no table here") != nil {
		t.Error("rows from an output without a table")
	}
}
