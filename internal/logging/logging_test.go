package logging

import (
	"bytes"
	"encoding/json"
	"flag"
	"strings"
	"testing"
)

func TestLevelFlag(t *testing.T) {
	fs := flag.NewFlagSet("prog", flag.ContinueOnError)
	fs.SetOutput(&bytes.Buffer{})
	var l Level
	AddLevelFlag(fs, &l)
	if err := fs.Parse([]string{"--log-level", "debug"}); err != nil || l.String() != "debug" {
		t.Fatalf("debug: %v, %v", l, err)
	}
	if err := fs.Parse([]string{"--log-level", "loud"}); err == nil || !strings.Contains(err.Error(), "use debug, info, warn or error") {
		t.Fatalf("a bad level: %v", err)
	}
}

func TestFormatsAndLevel(t *testing.T) {
	var out bytes.Buffer
	log := New(Config{Program: "p", Format: JSON, Level: Level{Level: 4}, Output: &out})
	log.Info("hidden")
	log.Warn("shown", "component", "c")
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	if len(lines) != 1 {
		t.Fatalf("got %d lines at level warn, want 1:\n%s", len(lines), out.String())
	}
	var rec map[string]any
	if err := json.Unmarshal([]byte(lines[0]), &rec); err != nil || rec["msg"] != "shown" || rec["component"] != "c" {
		t.Fatalf("JSON record %v, %v", rec, err)
	}
	out.Reset()
	New(Config{Format: Text, Output: &out}).Info("hello", "k", "v")
	if !strings.Contains(out.String(), "msg=hello k=v") {
		t.Fatalf("text record %q", out.String())
	}
}
