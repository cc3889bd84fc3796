package cmd

import (
	"context"
	"os"
	"testing"
)

// TestMain lets the test binary stand in for the orrery binary: 'mini up'
// starts its supervisor by running its own executable.
func TestMain(m *testing.M) {
	if os.Getenv("ORRERY_CMD_TEST_AS_ORRERY") == "1" {
		os.Exit(Execute(context.Background(), os.Args[1:], os.Stdout, os.Stderr))
	}
	os.Exit(m.Run())
}
