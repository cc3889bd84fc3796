package tee

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
)

// The shared policy values read their JSON strictly and write what they
// read.
func TestPolicyValuesAreStrict(t *testing.T) {
	var e Expected
	if err := json.Unmarshal([]byte(`{"expected": "00ff", "warnOnly": true}`), &e); err != nil || !bytes.Equal(e.Expected, []byte{0, 0xff}) || !e.WarnOnly {
		t.Fatalf("Expected = %+v, %v", e, err)
	}
	if out, err := json.Marshal(e); err != nil || string(out) != `{"expected":"00ff","warnOnly":true}` {
		t.Fatalf("Marshal = %s, %v", out, err)
	}
	var m MinimumVersion
	if err := json.Unmarshal([]byte(`{"minimum": 4}`), &m); err != nil || m.Minimum != 4 || m.WarnOnly {
		t.Fatalf("MinimumVersion = %+v, %v", m, err)
	}
	for in, want := range map[string]string{
		`{"warnOnly": true}`:                   "expected",
		`{"expected": "zz"}`:                   "expected",
		`{"expected": "00", "expected": "01"}`: "expected",
		`{"expected": "00", "warnonly": true}`: "warnonly",
		`{"expected": null}`:                   "expected",
		`{"expected": "00"} {}`:                "",
	} {
		if err := json.Unmarshal([]byte(in), new(Expected)); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Expected from %s: %v; want an error naming %q", in, err, want)
		}
	}
	for _, in := range []string{`{}`, `{"minimum": -1}`, `{"minimum": 1.5}`, `{"minimum": 4294967296}`, `{"minimum": "4"}`} {
		if err := json.Unmarshal([]byte(in), new(MinimumVersion)); err == nil {
			t.Errorf("MinimumVersion from %s was accepted", in)
		}
	}
}
