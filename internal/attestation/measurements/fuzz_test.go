package measurements

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"
)

// Seeds shared by both fuzzers; JSON is YAML too. More seeds, including
// near misses, live in testdata/fuzz.
var fuzzSeeds = []string{
	`{"4": {"expected": "` + strings.Repeat("ab", 32) + `", "warnOnly": false}}`,
	`{"4": {"expected": "` + strings.Repeat("04", 32) + `"}, "9": {"expected": "` +
		strings.Repeat("09", 32) + `", "warnOnly": true}, "11": {"expected": "` + strings.Repeat("0B", 32) + `"}}`,
	`{"23": {"expected": "` + strings.Repeat("00", 32) + `", "warnOnly": true}}`,
	`{"24": {"expected": "` + strings.Repeat("00", 32) + `"}}`,
	`{"4": {"expected": "` + strings.Repeat("00", 31) + `"}}`,
	`{"4": null}`,
	`{"4": {"expected": "x"}, "4": {}}`,
	`null`,
	`{}`,
	"4:\n  expected: \"" + strings.Repeat("cd", 32) + "\"\n  warnOnly: yes\n",
	"---\n11: {expected: '" + strings.Repeat("11", 32) + "'}\n...\n",
}

// checkRoundTrip asserts that an accepted set survives writing and reading
// back unchanged, and that writing is deterministic.
func checkRoundTrip(t *testing.T, m M) {
	t.Helper()
	out, err := json.Marshal(m)
	if err != nil {
		t.Fatalf("parsed measurements do not marshal: %v", err)
	}
	again, err := ParseJSON(out)
	if err != nil {
		t.Fatalf("marshalled measurements do not parse: %v\n%s", err, out)
	}
	if !again.Equal(m) {
		t.Fatalf("round trip changed the measurements: %v became %v", m, again)
	}
	out2, err := json.Marshal(again)
	if err != nil || !bytes.Equal(out, out2) {
		t.Fatalf("marshalling is not stable: %s then %s (%v)", out, out2, err)
	}
}

func FuzzParseJSON(f *testing.F) {
	for _, s := range fuzzSeeds {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		m, err := ParseJSON(data)
		if err != nil {
			return
		}
		if err := m.Validate(); err != nil {
			t.Fatalf("ParseJSON accepted invalid measurements: %v", err)
		}
		checkRoundTrip(t, m)
	})
}

func FuzzParseYAML(f *testing.F) {
	for _, s := range fuzzSeeds {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		m, err := ParseYAML(data)
		if err != nil {
			return
		}
		if err := m.Validate(); err != nil {
			t.Fatalf("ParseYAML accepted invalid measurements: %v", err)
		}
		checkRoundTrip(t, m)

		// The YAML the CLI would show an owner must read back the same.
		y, err := yaml.Marshal(m)
		if err != nil {
			t.Fatalf("parsed measurements do not marshal to YAML: %v", err)
		}
		again, err := ParseYAML(y)
		if err != nil {
			t.Fatalf("marshalled YAML does not parse: %v\n%s", err, y)
		}
		if !again.Equal(m) {
			t.Fatalf("YAML round trip changed the measurements: %v became %v", m, again)
		}
	})
}
