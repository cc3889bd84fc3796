package upgradeserver

import (
	"context"
	"strings"
	"testing"

	"github.com/orrery-dev/orrery/internal/proto/kubeupgradepb"
)

// Output without newlines, or more lines than a message holds, reaches a
// follower in bounded pieces, all of it.
func TestJobBoundsWhatItSends(t *testing.T) {
	j := newJob("v1.37.2", kubeupgradepb.Step_STEP_NODE, func(string) {})
	long := strings.Repeat("x", 3*maxLineBytes+10)
	if _, err := j.Write([]byte(long)); err != nil {
		t.Fatal(err)
	}
	for range 2 * maxBatch {
		if _, err := j.Write([]byte("a line\n")); err != nil {
			t.Fatal(err)
		}
	}
	j.finish(nil)
	var got strings.Builder
	var lines int
	err := j.follow(context.Background(), func(batch []string) error {
		if len(batch) > maxBatch {
			t.Errorf("a message of %d lines, want at most %d", len(batch), maxBatch)
		}
		for _, l := range batch {
			if len(l) > maxLineBytes {
				t.Errorf("a line of %d bytes, want at most %d", len(l), maxLineBytes)
			}
			got.WriteString(l)
			lines++
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if want := long + strings.Repeat("a line", 2*maxBatch); got.String() != want {
		t.Errorf("the follower got %d bytes, want %d", got.Len(), len(want))
	}
	if lines != 3+2*maxBatch { // the rest of the long line joins the first "a line"
		t.Errorf("%d lines, want %d", lines, 3+2*maxBatch)
	}
}

// followAll is everything a job sent its follower, joined.
func followAll(t *testing.T, j *job) string {
	t.Helper()
	var got strings.Builder
	if err := j.follow(context.Background(), func(batch []string) error {
		for _, l := range batch {
			got.WriteString(l + "\n")
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return got.String()
}

// A secret in a line longer than a follower's line is redacted before
// the line is split, wherever it falls; and a line so long that its rest
// is dropped shows no part of a secret at its cut.
func TestJobRedactsLongLinesWhole(t *testing.T) {
	const token = "abcdef.0123456789abcdef"
	var logged []string
	j := newJob("v1.37.2", kubeupgradepb.Step_STEP_NODE, func(l string) { logged = append(logged, l) })
	var writes []string
	// the token straddles the split at maxLineBytes
	writes = append(writes, strings.Repeat("x", maxLineBytes-10)+" --token "+token+"\n")
	// written a byte at a time
	for _, b := range "kubeadm join --token " + token + "\n" {
		writes = append(writes, string(b))
	}
	// a line past maxPendingBytes whose newline comes later, cut inside
	// the token, and one with no blank before the cut at all
	writes = append(writes,
		strings.Repeat("y ", (maxPendingBytes-12)/2)+"--token "+token, " and more\nnext\n",
		strings.Repeat("z", maxPendingBytes-5)+"--token="+token, " more\nlast\n")
	for _, w := range writes {
		if _, err := j.Write([]byte(w)); err != nil {
			t.Fatal(err)
		}
	}
	j.finish(nil)
	got := followAll(t, j)
	for _, part := range []string{token, "0123456789", "abcdef.012"} {
		if strings.Contains(got, part) || strings.Contains(strings.Join(logged, "\n"), part) {
			t.Errorf("the output shows %q", part)
		}
	}
	for _, want := range []string{"--token [REDACTED]", lineCut, "\nnext\n", "\nlast\n"} {
		if !strings.Contains(got, want) {
			t.Errorf("the output lacks %q", want)
		}
	}
	if strings.Contains(got, "and more") {
		t.Error("the rest of a cut line was shown")
	}
}
