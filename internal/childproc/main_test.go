package childproc

import (
	"runtime"
	"testing"

	"go.uber.org/goleak"
)

// init keeps the main goroutine on the process's first thread. The Go
// runtime never ends that thread (it parks it instead), so a test's
// goroutine that locks a thread and returns without unlocking it, to
// end the thread as the network-namespace helpers do, would sometimes
// leave its thread alive when it happened to run there, and a test of the
// parent-death hazard would not see it.
func init() { runtime.LockOSThread() }

// TestMain fails the package's tests if one leaves a goroutine behind.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}
