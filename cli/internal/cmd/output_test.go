package cmd

import (
	"bytes"
	"context"
	"encoding/json"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/spf13/cobra"
	"sigs.k8s.io/yaml"

	"github.com/orrery-dev/orrery/internal/termtext"
)

var termtextUnsafe = termtext.Unsafe

// checkYAMLMatchesJSON runs a command with -o json and with -o yaml and
// checks that both parse to the same data: the same field names and
// values. Fields named in volatile (an uptime) are compared by presence
// only, since the two runs are moments apart.
func checkYAMLMatchesJSON(t *testing.T, run func(args ...string) (string, string, int), args []string, volatile ...string) {
	t.Helper()
	decode := func(format string, unmarshal func([]byte, any) error) any {
		t.Helper()
		out, errOut, code := run(append(args, "-o", format)...)
		if code != 0 {
			t.Fatalf("orrery %s -o %s: exit %d: %s", strings.Join(args, " "), format, code, errOut)
		}
		var v any
		if err := unmarshal([]byte(out), &v); err != nil {
			t.Fatalf("orrery %s -o %s does not parse: %v\n%s", strings.Join(args, " "), format, err, out)
		}
		return blank(v, volatile)
	}
	fromJSON := decode("json", json.Unmarshal)
	fromYAML := decode("yaml", func(b []byte, v any) error { return yaml.Unmarshal(b, v) })
	if !reflect.DeepEqual(fromJSON, fromYAML) {
		t.Errorf("orrery %s: -o yaml differs from -o json:\njson: %v\nyaml: %v", strings.Join(args, " "), fromJSON, fromYAML)
	}
}

// blank replaces the values of the volatile fields, at any depth, with a
// marker.
func blank(v any, volatile []string) any {
	switch x := v.(type) {
	case map[string]any:
		for k, e := range x {
			if slices.Contains(volatile, k) {
				x[k] = "<volatile>"
				continue
			}
			x[k] = blank(e, volatile)
		}
	case []any:
		for i, e := range x {
			x[i] = blank(e, volatile)
		}
	}
	return v
}

func execute(args ...string) (string, string, int) {
	var out, errOut bytes.Buffer
	code := Execute(context.Background(), args, &out, &errOut)
	return out.String(), errOut.String(), code
}

func TestVersionOutputs(t *testing.T) {
	checkYAMLMatchesJSON(t, execute, []string{"version"})
	out, errOut, code := execute("version", "-o", "jsonpath={.releases[*].name}")
	if code != 0 || strings.TrimSpace(out) != "orrery-crds flannel orrery-services" {
		t.Fatalf("-o jsonpath: exit %d, %q %s", code, out, errOut)
	}
	if _, errOut, code := execute("version", "-o", "jsonpath={.nope}"); code == 0 || !strings.Contains(errOut, "nope is not found") {
		t.Fatalf("-o jsonpath of a missing field: exit %d, %s", code, errOut)
	}
}

// Every command that prints data lists its fields in its help, so scripts
// have names to rely on.
func TestDataCommandsListTheirFields(t *testing.T) {
	var walk func(c *cobra.Command)
	n := 0
	walk = func(c *cobra.Command) {
		if f := c.Flags().Lookup("output"); f != nil && strings.Contains(f.Usage, "jsonpath") {
			n++
			if !strings.Contains(c.Long, "Fields of -o json, yaml and jsonpath:\n  .") && !strings.Contains(c.Long, "Fields of -o json, yaml and jsonpath:\n  [].") {
				t.Errorf("orrery %s takes -o but its help lists no fields", c.CommandPath())
			}
		}
		for _, sub := range c.Commands() {
			walk(sub)
		}
	}
	walk(newRootCmd())
	if n < 7 {
		t.Errorf("%d commands take -o json/yaml/jsonpath; want at least 7", n)
	}
}

// TestOutputEscapesWhatNodesSaid: a unit's description, a node's error
// or version, as a node or kubelet wrote it, reaches the terminal in no
// format as a control sequence, and json and yaml still read back to the
// same text.
func TestOutputEscapesWhatNodesSaid(t *testing.T) {
	hostile := "ok\x1b]52;c;Y3VybCBldmlsfHNo\x07\x1b[2K\u009b1A\u202e\x7f\nfake line"
	data := []unitState{{Name: "evil.service", Description: hostile}}
	for _, format := range []string{"json", "yaml", "jsonpath={[*].description}"} {
		t.Run(format, func(t *testing.T) {
			var b bytes.Buffer
			if err := writeData(&b, format, data); err != nil {
				t.Fatal(err)
			}
			for _, r := range b.String() {
				if (r < 0x20 && r != '\n') || r == 0x7f || termtextUnsafe(r) {
					t.Fatalf("-o %s printed %U raw:\n%q", format, r, b.String())
				}
			}
			var back []unitState
			want := hostile
			switch format {
			case "json":
				if err := json.Unmarshal(b.Bytes(), &back); err != nil {
					t.Fatal(err)
				}
			case "yaml":
				if err := yaml.Unmarshal(b.Bytes(), &back); err != nil {
					t.Fatal(err)
				}
				want = termtext.Line(hostile)
			default:
				if strings.Count(b.String(), "\n") != 1 {
					t.Fatalf("-o %s split one description over lines: %q", format, b.String())
				}
				return
			}
			if back[0].Description != want {
				t.Errorf("-o %s reads back as %q, want %q", format, back[0].Description, want)
			}
		})
	}
	var b bytes.Buffer
	if err := writeUnits(&b, data); err != nil {
		t.Fatal(err)
	}
	if lines := strings.Count(b.String(), "\n"); lines != 2 {
		t.Errorf("the text table has %d lines for one unit, want 2 (header and unit):\n%s", lines, b.String())
	}
}
