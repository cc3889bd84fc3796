package cmd

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"reflect"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"k8s.io/client-go/util/jsonpath"
	"sigs.k8s.io/yaml"

	"github.com/orrery-dev/orrery/internal/termtext"
)

// addOutputFlag adds -o/--output: text for people; json, yaml or a
// jsonpath template, kubectl's formats, for scripts. The field names are
// the same in all three, and each command's help lists them.
func addOutputFlag(c *cobra.Command, output *string) {
	c.Flags().StringVarP(output, "output", "o", "text", "output format: text, json, yaml, or jsonpath=TEMPLATE (as kubectl's, e.g. -o jsonpath='{.nodes[*].name}')")
}

func checkOutput(output string) error {
	switch {
	case output == "text" || output == "json" || output == "yaml":
		return nil
	case strings.HasPrefix(output, "jsonpath="):
		if _, err := parseJSONPath(output); err != nil {
			return err
		}
		return nil
	}
	return fmt.Errorf("--output %q: use text, json, yaml or jsonpath=TEMPLATE", output)
}

func parseJSONPath(output string) (*jsonpath.JSONPath, error) {
	tmpl := strings.TrimPrefix(output, "jsonpath=")
	jp := jsonpath.New("output").AllowMissingKeys(false)
	if err := jp.Parse(tmpl); err != nil {
		return nil, fmt.Errorf("--output jsonpath template %q: %w", tmpl, err)
	}
	return jp, nil
}

// writeData writes v as JSON, as YAML with the same field names, or
// through a jsonpath template over its JSON form. Much of v is what nodes
// and the API server said: JSON escapes what is not printable (and reads
// back as it was); YAML and jsonpath print strings escaped as
// termtext.Line does.
func writeData(w io.Writer, output string, v any) error {
	switch {
	case output == "yaml":
		// YAML cannot hold control characters at all (the encoder
		// refuses them): they are printed escaped, as in jsonpath.
		data, err := viaJSON(v)
		if err != nil {
			return err
		}
		b, err := yaml.Marshal(escapeStrings(data))
		if err != nil {
			return err
		}
		_, err = w.Write(b)
		return err
	case strings.HasPrefix(output, "jsonpath="):
		jp, err := parseJSONPath(output)
		if err != nil {
			return err
		}
		data, err := viaJSON(v)
		if err != nil {
			return err
		}
		if err := jp.Execute(w, escapeStrings(data)); err != nil {
			return fmt.Errorf("--output: %w", err)
		}
		_, err = fmt.Fprintln(w)
		return err
	}
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetIndent("", "  ")
	if err := enc.Encode(v); err != nil {
		return err
	}
	_, err := w.Write(termtext.JSON(b.Bytes()))
	return err
}

// viaJSON is v as its JSON form decodes: maps, slices and scalars.
func viaJSON(v any) (any, error) {
	raw, err := json.Marshal(v)
	if err != nil {
		return nil, err
	}
	var data any
	err = json.Unmarshal(raw, &data)
	return data, err
}

// escapeStrings is decoded JSON with every string escaped for one line.
func escapeStrings(v any) any {
	switch t := v.(type) {
	case string:
		return termtext.Line(t)
	case []any:
		for i := range t {
			t[i] = escapeStrings(t[i])
		}
	case map[string]any:
		for k, e := range t {
			t[k] = escapeStrings(e)
		}
	}
	return v
}

// describeOutput appends to c's help the field paths that -o json, yaml
// and jsonpath print for data like v, read from its JSON names, so the
// list cannot drift from what is printed.
func describeOutput(c *cobra.Command, v any) {
	fields := outputFields(reflect.TypeOf(v), "")
	c.Long = strings.TrimRight(c.Long, "\n") + "\n\nFields of -o json, yaml and jsonpath:\n  " + strings.Join(fields, "\n  ")
}

func outputFields(t reflect.Type, prefix string) []string {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	switch t.Kind() {
	case reflect.Slice, reflect.Array:
		if t.Elem().Kind() == reflect.Uint8 {
			return []string{prefix}
		}
		return outputFields(t.Elem(), prefix+"[]")
	case reflect.Struct:
		if t == reflect.TypeOf(time.Time{}) {
			return []string{prefix}
		}
	default:
		return []string{prefix}
	}
	var out []string
	for i := range t.NumField() {
		f := t.Field(i)
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		if !f.IsExported() || name == "-" {
			continue
		}
		if name == "" {
			name = f.Name
		}
		path := "." + name
		if prefix != "" {
			path = prefix + "." + name
		}
		out = append(out, outputFields(f.Type, path)...)
	}
	return out
}
