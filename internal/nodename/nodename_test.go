package nodename

import (
	"strings"
	"testing"
)

func TestValid(t *testing.T) {
	for name, want := range map[string]bool{
		"cp-0":                          true,
		"worker-0.example.internal":     true,
		"":                              false,
		"CP-0":                          false,
		"-cp":                           false,
		"cp-":                           false,
		"a..b":                          false,
		"cp_0":                          false,
		"cp 0":                          false,
		"cp-0\n":                        false,
		strings.Repeat("a", 64):         false,
		strings.Repeat("a.", 126) + "a": true,
		strings.Repeat("a.", 127) + "a": false,
	} {
		if got := Valid(name); got != want {
			t.Errorf("Valid(%q) = %v, want %v", name, got, want)
		}
	}
}
