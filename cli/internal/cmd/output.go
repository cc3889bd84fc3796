package cmd

import (
	"encoding/json"
	"fmt"
	"io"
	"reflect"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"k8s.io/client-go/util/jsonpath"
	"sigs.k8s.io/yaml"
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
// through a jsonpath template over its JSON form.
func writeData(w io.Writer, output string, v any) error {
	switch {
	case output == "yaml":
		b, err := yaml.Marshal(v)
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
		raw, err := json.Marshal(v)
		if err != nil {
			return err
		}
		var data any
		if err := json.Unmarshal(raw, &data); err != nil {
			return err
		}
		if err := jp.Execute(w, data); err != nil {
			return fmt.Errorf("--output: %w", err)
		}
		_, err = fmt.Fprintln(w)
		return err
	}
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
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
