package initserver

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the package's tests if one leaves a goroutine behind: a
// daemon's goroutine that outlives its work holds the node lock, a file
// or a connection that the next step expects free.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}
