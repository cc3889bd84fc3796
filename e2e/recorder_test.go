//go:build e2e

package e2e

import (
	"fmt"
	"testing"
	"time"
)

// recordingT is the suite's *testing.T that also keeps the first failure
// it reports. CI shows only the last lines of a run, and go test prints a
// case's error where the case ran, a thousand lines above the end:
// failureSummary repeats it last. The suite's helpers take testing.TB, so
// that their errors pass through here too.
type recordingT struct {
	*testing.T
	first string
}

func (r *recordingT) record(msg string) {
	if r.first == "" {
		r.first = msg
	}
}

func (r *recordingT) Fatalf(format string, args ...any) {
	r.Helper()
	r.record(fmt.Sprintf(format, args...))
	r.T.Fatalf(format, args...)
}

func (r *recordingT) Fatal(args ...any) {
	r.Helper()
	r.record(fmt.Sprint(args...))
	r.T.Fatal(args...)
}

func (r *recordingT) Errorf(format string, args ...any) {
	r.Helper()
	r.record(fmt.Sprintf(format, args...))
	r.T.Errorf(format, args...)
}

func (r *recordingT) Error(args ...any) {
	r.Helper()
	r.record(fmt.Sprint(args...))
	r.T.Error(args...)
}

// tester is what the suite's helpers need of a test: testing.TB, and go
// test's deadline, which their waits must end before.
type tester interface {
	testing.TB
	Deadline() (time.Time, bool)
}
