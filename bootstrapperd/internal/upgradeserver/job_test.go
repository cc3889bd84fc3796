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
