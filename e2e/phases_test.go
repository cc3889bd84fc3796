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

// A wait ends before go test's deadline, with the teardown's time left.
func TestWaitDeadline(t *testing.T) {
	end, ok := t.Deadline()
	if !ok {
		t.Skip("go test -timeout 0: no deadline")
	}
	if got := waitDeadline(t, 1000*time.Hour); !got.Equal(end.Add(-teardown)) {
		t.Errorf("waitDeadline(1000h) = %s, want go test's deadline less %s (%s)", got, teardown, end.Add(-teardown))
	}
	if end.Add(-teardown).Before(time.Now().Add(time.Minute)) {
		t.Skip("less than the teardown and a minute left")
	}
	before := time.Now()
	if got := waitDeadline(t, time.Second); got.Before(before.Add(time.Second)) || got.After(time.Now().Add(time.Second)) {
		t.Errorf("waitDeadline(1s) = %s, want a second from now (%s)", got, before.Add(time.Second))
	}
}

func TestPatience(t *testing.T) {
	defer func(old float64) { *slowdown = old }(*slowdown)
	for _, c := range []struct {
		slowdown float64
		want     time.Duration
	}{
		{1, 10 * time.Minute},
		{2, 20 * time.Minute},
		{1.5, 15 * time.Minute},
		// Less than 1 would cut the waits that an idle host needs.
		{0.5, 10 * time.Minute},
		{0, 10 * time.Minute},
	} {
		*slowdown = c.slowdown
		if got := patience(10 * time.Minute); got != c.want {
			t.Errorf("-slowdown %v: patience(10m) = %s, want %s", c.slowdown, got, c.want)
		}
	}
}
