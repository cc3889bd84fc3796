package measurements

import (
	"bytes"
	"encoding/hex"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"
)

// digest returns a 32-byte value filled with b.
func digest(b byte) []byte { return bytes.Repeat([]byte{b}, DigestSize) }

// hexDigest is digest(b) as it appears in a file.
func hexDigest(b byte) string { return hex.EncodeToString(digest(b)) }

// parseJSONCases are TestParseJSON's cases.
var parseJSONCases = map[string]struct {
	input   string
	want    M
	wantErr string
}{
	"image PCRs": {
		input: `{"4": {"expected": "` + hexDigest(4) + `", "warnOnly": false},
		         "9": {"expected": "` + hexDigest(9) + `", "warnOnly": false},
		         "11": {"expected": "` + hexDigest(11) + `", "warnOnly": true}}`,
		want: M{
			4:  {Expected: digest(4)},
			9:  {Expected: digest(9)},
			11: {Expected: digest(11), WarnOnly: true},
		},
	},
	"warnOnly omitted enforces": {
		input: `{"0": {"expected": "` + hexDigest(0) + `"}}`,
		want:  M{0: {Expected: digest(0)}},
	},
	"upper-case hex": {
		input: `{"23": {"expected": "` + strings.ToUpper(hexDigest(0xab)) + `"}}`,
		want:  M{23: {Expected: digest(0xab)}},
	},
	"escaped key": {
		input: `{"\u0034": {"expected": "` + hexDigest(4) + `"}}`,
		want:  M{4: {Expected: digest(4)}},
	},
	"empty input": {
		input: "", wantErr: "input is empty",
	},
	"whitespace": {
		input: " \n\t ", wantErr: "input is empty",
	},
	"null": {
		input: "null", wantErr: "no measurements",
	},
	"empty object": {
		input: "{}", wantErr: "no measurements",
	},
	"array": {
		input: "[]", wantErr: "must be an object mapping PCR indexes",
	},
	"truncated": {
		input: `{"4": {"expected": "` + hexDigest(4), wantErr: "unexpected end of JSON input",
	},
	"trailing data": {
		input: `{"4": {"expected": "` + hexDigest(4) + `"}} {}`, wantErr: "invalid character",
	},
	"bad hex": {
		input:   `{"4": {"expected": "` + strings.Repeat("zz", 32) + `"}}`,
		wantErr: "PCR 4: expected value is not hex: encoding/hex: invalid byte",
	},
	"odd-length hex": {
		input:   `{"4": {"expected": "` + hexDigest(4)[:63] + `"}}`,
		wantErr: "PCR 4: expected value is not hex",
	},
	"short value": {
		input:   `{"4": {"expected": "` + hexDigest(4)[:62] + `"}}`,
		wantErr: "PCR 4: expected value has 31 bytes, want 32 (SHA-256)",
	},
	"long value": {
		input:   `{"4": {"expected": "` + hexDigest(4) + `00"}}`,
		wantErr: "PCR 4: expected value has 33 bytes, want 32 (SHA-256)",
	},
	"SHA-1 value": {
		input:   `{"4": {"expected": "` + strings.Repeat("00", 20) + `"}}`,
		wantErr: "PCR 4: expected value has 20 bytes, want 32 (SHA-256)",
	},
	"empty value": {
		input:   `{"4": {"expected": ""}}`,
		wantErr: "PCR 4: expected value is missing",
	},
	"missing value": {
		input:   `{"4": {"warnOnly": true}}`,
		wantErr: "PCR 4: expected value is missing",
	},
	"null measurement": {
		input:   `{"4": null}`,
		wantErr: "PCR 4: expected value is missing",
	},
	"measurement not an object": {
		input:   `{"4": "` + hexDigest(4) + `"}`,
		wantErr: "PCR 4: a measurement must be an object",
	},
	"numeric value": {
		input:   `{"4": {"expected": 1234}}`,
		wantErr: "PCR 4: expected value must be a hex string",
	},
	"string warnOnly": {
		input:   `{"4": {"expected": "` + hexDigest(4) + `", "warnOnly": "false"}}`,
		wantErr: "PCR 4: warnOnly must be true or false",
	},
	"PCR out of range": {
		input:   `{"24": {"expected": "` + hexDigest(4) + `"}}`,
		wantErr: "PCR 24: index out of range (valid PCRs are 0-23)",
	},
	"huge PCR": {
		input:   `{"4294967296": {"expected": "` + hexDigest(4) + `"}}`,
		wantErr: `key "4294967296" is not a PCR index`,
	},
	"non-numeric key": {
		input:   `{"pcr4": {"expected": "` + hexDigest(4) + `"}}`,
		wantErr: `key "pcr4" is not a PCR index`,
	},
	"negative key": {
		input:   `{"-1": {"expected": "` + hexDigest(4) + `"}}`,
		wantErr: `key "-1" is not a PCR index`,
	},
	"leading zero": {
		input:   `{"04": {"expected": "` + hexDigest(4) + `"}}`,
		wantErr: `key "04" is not a PCR index`,
	},
	"empty key": {
		input:   `{"": {"expected": "` + hexDigest(4) + `"}}`,
		wantErr: `key "" is not a PCR index`,
	},
	"unknown field": {
		input:   `{"4": {"expected": "` + hexDigest(4) + `", "warnonly": true}}`,
		wantErr: `PCR 4: unknown field "warnonly"`,
	},
	"field in other case": {
		input:   `{"4": {"Expected": "` + hexDigest(4) + `"}}`,
		wantErr: `PCR 4: unknown field "Expected"`,
	},
	"duplicate PCR": {
		input: `{"4": {"expected": "` + hexDigest(4) + `"},
		         "4": {"expected": "` + hexDigest(5) + `"}}`,
		wantErr: "PCR 4 appears twice",
	},
	"duplicate field": {
		input:   `{"4": {"expected": "` + hexDigest(4) + `", "expected": "` + hexDigest(5) + `"}}`,
		wantErr: `PCR 4: field "expected" appears twice`,
	},
}

func TestParseJSON(t *testing.T) {
	testCases := parseJSONCases
	for name, tc := range testCases {
		t.Run(name, func(t *testing.T) {
			got, err := ParseJSON([]byte(tc.input))
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("ParseJSON() error = %v, want one containing %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("ParseJSON() error = %v", err)
			}
			if !got.Equal(tc.want) {
				t.Errorf("ParseJSON() = %v, want %v", got, tc.want)
			}
		})
	}
}

// parseYAMLCases are TestParseYAML's cases.
var parseYAMLCases = map[string]struct {
	input   string
	want    M
	wantErr string
}{
	"image PCRs": {
		input: "4:\n  expected: \"" + hexDigest(4) + "\"\n  warnOnly: false\n" +
			"11:\n  expected: '" + hexDigest(11) + "'\n  warnOnly: true\n",
		want: M{4: {Expected: digest(4)}, 11: {Expected: digest(11), WarnOnly: true}},
	},
	"unquoted hex": {
		input: "9: {expected: " + hexDigest(0xaa) + "}\n",
		want:  M{9: {Expected: digest(0xaa)}},
	},
	"quoted key": {
		input: "\"9\": {expected: \"" + hexDigest(9) + "\"}\n",
		want:  M{9: {Expected: digest(9)}},
	},
	"JSON is YAML": {
		input: `{"4": {"expected": "` + hexDigest(4) + `", "warnOnly": false}}`,
		want:  M{4: {Expected: digest(4)}},
	},
	"document markers": {
		input: "%YAML 1.1\n# measurements of image v1\n---\n4: {expected: \"" + hexDigest(4) + "\"}\n...\n# end\n",
		want:  M{4: {Expected: digest(4)}},
	},
	"content on the start line": {
		input: "--- {\"4\": {\"expected\": \"" + hexDigest(4) + "\"}}\n",
		want:  M{4: {Expected: digest(4)}},
	},
	"commented and indented markers": {
		input: "4: {expected: \"" + hexDigest(4) + "\"}\n# ---\n  # ...\n",
		want:  M{4: {Expected: digest(4)}},
	},
	"second document": {
		input:   "4: {expected: \"" + hexDigest(4) + "\"}\n---\n9: {expected: \"" + hexDigest(9) + "\"}\n",
		wantErr: "line 2: a second YAML document starts here",
	},
	"second document after a start marker": {
		input:   "---\n4: {expected: \"" + hexDigest(4) + "\"}\n--- # more\n9: {expected: \"" + hexDigest(9) + "\"}\n",
		wantErr: "line 3: a second YAML document starts here",
	},
	"text after the document end": {
		input:   "4: {expected: \"" + hexDigest(4) + "\"}\n...\n9: {expected: \"" + hexDigest(9) + "\"}\n",
		wantErr: "line 3: text after the end of the YAML document",
	},
	"empty": {
		input: "", wantErr: "input is empty",
	},
	"only a comment": {
		input: "# nothing\n", wantErr: "no measurements",
	},
	"not YAML": {
		input: "4: [\n", wantErr: "not valid YAML",
	},
	"list": {
		input: "- 4\n- 9\n", wantErr: "must be an object mapping PCR indexes",
	},
	"digits-only value unquoted": {
		input:   "12: {expected: " + strings.Repeat("0", 64) + "}\n",
		wantErr: "PCR 12: expected value must be a hex string (in YAML, put it in quotes)",
	},
	"bad hex": {
		input:   "4: {expected: \"" + strings.Repeat("x", 64) + "\"}\n",
		wantErr: "PCR 4: expected value is not hex",
	},
	"short value": {
		input:   "4: {expected: \"" + hexDigest(4)[:62] + "\"}\n",
		wantErr: "PCR 4: expected value has 31 bytes, want 32 (SHA-256)",
	},
	"PCR out of range": {
		input:   "99: {expected: \"" + hexDigest(4) + "\"}\n",
		wantErr: "PCR 99: index out of range",
	},
	"non-numeric key": {
		input:   "four: {expected: \"" + hexDigest(4) + "\"}\n",
		wantErr: `key "four" is not a PCR index`,
	},
	"unknown field": {
		input:   "4: {expected: \"" + hexDigest(4) + "\", enforce: true}\n",
		wantErr: `PCR 4: unknown field "enforce"`,
	},
	"duplicate PCR": {
		input:   "4: {expected: \"" + hexDigest(4) + "\"}\n4: {expected: \"" + hexDigest(5) + "\"}\n",
		wantErr: "already set",
	},
	"duplicate field": {
		input:   "4: {expected: \"" + hexDigest(4) + "\", expected: \"" + hexDigest(5) + "\"}\n",
		wantErr: "already set",
	},
}

func TestParseYAML(t *testing.T) {
	testCases := parseYAMLCases
	for name, tc := range testCases {
		t.Run(name, func(t *testing.T) {
			got, err := ParseYAML([]byte(tc.input))
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("ParseYAML() error = %v, want one containing %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("ParseYAML() error = %v", err)
			}
			if !got.Equal(tc.want) {
				t.Errorf("ParseYAML() = %v, want %v", got, tc.want)
			}
		})
	}
}

func TestLoad(t *testing.T) {
	jsonData := `{"4": {"expected": "` + hexDigest(4) + `", "warnOnly": false}}`
	yamlData := "4:\n  expected: \"" + hexDigest(4) + "\"\n"
	want := M{4: {Expected: digest(4)}}
	testCases := map[string]struct {
		name    string
		content string
		wantErr string
	}{
		"json":                 {name: "measurements.json", content: jsonData},
		"yaml":                 {name: "measurements.yaml", content: yamlData},
		"yml":                  {name: "measurements.yml", content: yamlData},
		"upper-case extension": {name: "MEASUREMENTS.JSON", content: jsonData},
		"JSON in a .yaml file": {name: "measurements.yaml", content: jsonData},
		"YAML in a .json file": {name: "measurements.json", content: yamlData, wantErr: "invalid character"},
		"no extension":         {name: "measurements", content: jsonData, wantErr: `unknown file extension ""`},
		"other extension":      {name: "measurements.toml", content: jsonData, wantErr: `unknown file extension ".toml"`},
		"invalid content":      {name: "measurements.json", content: "{}", wantErr: "no measurements"},
	}
	for name, tc := range testCases {
		t.Run(name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), tc.name)
			if err := os.WriteFile(path, []byte(tc.content), 0o644); err != nil {
				t.Fatal(err)
			}
			got, err := Load(path)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("Load() error = %v, want one containing %q", err, tc.wantErr)
				}
				if !strings.Contains(err.Error(), path) {
					t.Errorf("error %q does not name the file", err)
				}
				return
			}
			if err != nil {
				t.Fatalf("Load() error = %v", err)
			}
			if !got.Equal(want) {
				t.Errorf("Load() = %v, want %v", got, want)
			}
		})
	}
}

func TestLoadMissingFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "measurements.json")
	_, err := Load(path)
	if err == nil || !strings.Contains(err.Error(), path) {
		t.Fatalf("Load() error = %v, want one naming %s", err, path)
	}
}

func TestMarshalJSON(t *testing.T) {
	testCases := map[string]struct {
		m       M
		want    string
		wantErr string
	}{
		"numeric PCR order": {
			m: M{
				11: {Expected: digest(0xb), WarnOnly: true},
				4:  {Expected: digest(0xa)},
				9:  {Expected: digest(0xc)},
			},
			want: `{"4":{"expected":"` + hexDigest(0xa) + `","warnOnly":false},` +
				`"9":{"expected":"` + hexDigest(0xc) + `","warnOnly":false},` +
				`"11":{"expected":"` + hexDigest(0xb) + `","warnOnly":true}}`,
		},
		"empty":   {m: M{}, wantErr: "no measurements"},
		"nil":     {m: nil, wantErr: "no measurements"},
		"short":   {m: M{4: {Expected: digest(4)[:31]}}, wantErr: "PCR 4: expected value has 31 bytes, want 32"},
		"missing": {m: M{4: {}}, wantErr: "PCR 4: expected value is missing"},
		"PCR 24":  {m: M{24: {Expected: digest(4)}}, wantErr: "PCR 24: index out of range"},
	}
	for name, tc := range testCases {
		t.Run(name, func(t *testing.T) {
			got, err := json.Marshal(tc.m)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("Marshal() error = %v, want one containing %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("Marshal() error = %v", err)
			}
			if string(got) != tc.want {
				t.Errorf("Marshal() =\n%s\nwant\n%s", got, tc.want)
			}
			// Map iteration order varies between runs; the output must not.
			for range 20 {
				again, err := json.Marshal(tc.m)
				if err != nil || !bytes.Equal(again, got) {
					t.Fatalf("Marshal() is not stable: %s, %v", again, err)
				}
			}
		})
	}
}

// TestMarshalInStruct covers M as a field of a larger config, the way the
// join service's config embeds it.
func TestMarshalInStruct(t *testing.T) {
	type config struct {
		Measurements M `json:"measurements"`
	}
	in := config{Measurements: M{4: {Expected: digest(4)}, 11: {Expected: digest(11), WarnOnly: true}}}
	data, err := json.Marshal(in)
	if err != nil {
		t.Fatal(err)
	}
	var out config
	if err := json.Unmarshal(data, &out); err != nil {
		t.Fatal(err)
	}
	if !out.Measurements.Equal(in.Measurements) {
		t.Errorf("round trip gave %v, want %v", out.Measurements, in.Measurements)
	}
	err = json.Unmarshal([]byte(`{"measurements": {"4": {"expected": "00"}}}`), &out)
	if err == nil || !strings.Contains(err.Error(), "PCR 4: expected value has 1 bytes") {
		t.Errorf("Unmarshal() error = %v, want the PCR named", err)
	}
}

func TestValidate(t *testing.T) {
	testCases := map[string]struct {
		m       M
		wantErr []string
	}{
		"valid":       {m: M{0: {Expected: digest(0)}, 23: {Expected: digest(23), WarnOnly: true}}},
		"nil":         {m: nil, wantErr: []string{"no measurements"}},
		"empty":       {m: M{}, wantErr: []string{"no measurements"}},
		"PCR 24":      {m: M{24: {Expected: digest(0)}}, wantErr: []string{"PCR 24: index out of range (valid PCRs are 0-23)"}},
		"short value": {m: M{4: {Expected: digest(0)[:31]}}, wantErr: []string{"PCR 4: expected value has 31 bytes, want 32 (SHA-256)"}},
		"no value":    {m: M{4: {WarnOnly: true}}, wantErr: []string{"PCR 4: expected value is missing"}},
		"all problems reported": {
			m:       M{4: {}, 9: {Expected: digest(9)}, 11: {Expected: []byte{1}}, 30: {Expected: digest(1)}},
			wantErr: []string{"PCR 4: expected value is missing", "PCR 11: expected value has 1 bytes", "PCR 30: index out of range"},
		},
	}
	for name, tc := range testCases {
		t.Run(name, func(t *testing.T) {
			err := tc.m.Validate()
			if len(tc.wantErr) == 0 {
				if err != nil {
					t.Fatalf("Validate() error = %v", err)
				}
				return
			}
			if err == nil {
				t.Fatalf("Validate() error = nil, want %q", tc.wantErr)
			}
			for _, want := range tc.wantErr {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("Validate() error = %v, want it to contain %q", err, want)
				}
			}
		})
	}
}

func TestCopyAndEqual(t *testing.T) {
	orig := M{4: {Expected: digest(4)}, 11: {Expected: digest(11), WarnOnly: true}}
	cp := orig.Copy()
	if !cp.Equal(orig) || !orig.Equal(cp) {
		t.Fatal("copy is not equal to the original")
	}
	cp[4].Expected[0] ^= 0xff
	if orig[4].Expected[0] != 4 {
		t.Fatal("changing the copy changed the original")
	}
	if M(nil).Copy() != nil {
		t.Error("Copy of nil is not nil")
	}

	testCases := map[string]struct {
		a, b M
		want bool
	}{
		"same":             {a: orig, b: orig.Copy(), want: true},
		"both empty":       {a: nil, b: M{}, want: true},
		"value differs":    {a: orig, b: cp, want: false},
		"warnOnly differs": {a: M{4: {Expected: digest(4)}}, b: M{4: {Expected: digest(4), WarnOnly: true}}, want: false},
		"PCR differs":      {a: M{4: {Expected: digest(4)}}, b: M{5: {Expected: digest(4)}}, want: false},
		"extra PCR":        {a: orig, b: M{4: {Expected: digest(4)}}, want: false},
	}
	for name, tc := range testCases {
		t.Run(name, func(t *testing.T) {
			if got := tc.a.Equal(tc.b); got != tc.want {
				t.Errorf("Equal() = %v, want %v", got, tc.want)
			}
			if got := tc.b.Equal(tc.a); got != tc.want {
				t.Errorf("Equal() reversed = %v, want %v", got, tc.want)
			}
		})
	}
}

// TestYAMLRoundTripNumberLikeValues covers digests whose hex YAML would
// read as a number if the writer forgot to quote them.
func TestYAMLRoundTripNumberLikeValues(t *testing.T) {
	testCases := map[string]string{
		"all zeros":      strings.Repeat("0", 64),
		"all nines":      strings.Repeat("9", 64),
		"exponent":       "1e" + strings.Repeat("1", 62),
		"exponent sign":  "1e" + strings.Repeat("0", 61) + "1",
		"trailing e":     "000000000000000000000000000000000000000000000000000000000000000e",
		"octal-like":     "0" + strings.Repeat("7", 63),
		"leading digits": strings.Repeat("1", 63) + "f",
	}
	for name, value := range testCases {
		t.Run(name, func(t *testing.T) {
			b, err := hex.DecodeString(value)
			if err != nil {
				t.Fatal(err)
			}
			m := M{4: {Expected: b}}
			y, err := yaml.Marshal(m)
			if err != nil {
				t.Fatal(err)
			}
			got, err := ParseYAML(y)
			if err != nil {
				t.Fatalf("ParseYAML() error = %v for\n%s", err, y)
			}
			if !got.Equal(m) {
				t.Errorf("round trip gave %v, want %v", got, m)
			}
		})
	}
}
