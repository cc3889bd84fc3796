package tdx

import (
	"encoding/json"
	"fmt"
	"reflect"
	"strings"
	"testing"

	"github.com/orrery-dev/orrery/internal/attestation/tee"
)

var (
	hex48 = strings.Repeat("11", 48)
	hex8  = "0000001000000000" // SEPT_VE_DISABLE
	hex16 = strings.Repeat("02", 16)
)

func TestParsePolicy(t *testing.T) {
	mrtd := `"mrtd": {"expected": "` + hex48 + `"}`
	tests := map[string]struct {
		in      string
		wantErr string
	}{
		"minimal": {in: `{` + mrtd + `}`},
		"every field": {in: `{"mrtd": {"expected": "` + hex48 + `", "warnOnly": false},
			"rtmr0": {"expected": "` + hex48 + `"}, "rtmr1": {"expected": "` + hex48 + `", "warnOnly": true},
			"rtmr2": {"expected": "` + hex48 + `"}, "rtmr3": {"expected": "` + strings.ToUpper(hex48) + `"},
			"mrseam": {"expected": "` + hex48 + `"}, "tdAttributes": {"expected": "` + hex8 + `"},
			"minimumTeeTcbSvn": {"minimum": "` + hex16 + `"}, "minimumQeSvn": {"minimum": 65535, "warnOnly": true}}`},
		"empty":                  {in: ``, wantErr: "must be a JSON object"},
		"null":                   {in: `null`, wantErr: "must be a JSON object"},
		"array":                  {in: `[]`, wantErr: "must be a JSON object"},
		"no mrtd":                {in: `{}`, wantErr: "mrtd is missing"},
		"unknown field":          {in: `{` + mrtd + `, "mrconfigid": {}}`, wantErr: `unknown field "mrconfigid"`},
		"field name in caps":     {in: `{"MRTD": {"expected": "` + hex48 + `"}}`, wantErr: `unknown field "MRTD"`},
		"field twice":            {in: `{` + mrtd + `, ` + mrtd + `}`, wantErr: "mrtd: appears twice"},
		"field twice, escaped":   {in: `{` + mrtd + `, "m\u0072td": {"expected": "` + hex48 + `"}}`, wantErr: "mrtd: appears twice"},
		"trailing data":          {in: `{` + mrtd + `} {}`, wantErr: "trailing data"},
		"trailing garbage":       {in: `{` + mrtd + `}x`, wantErr: "trailing data"},
		"truncated":              {in: `{` + mrtd, wantErr: "EOF"},
		"null field":             {in: `{` + mrtd + `, "rtmr0": null}`, wantErr: "rtmr0: is null"},
		"unknown nested field":   {in: `{"mrtd": {"expected": "` + hex48 + `", "warnonly": true}}`, wantErr: `mrtd: unknown field "warnonly"`},
		"nested field twice":     {in: `{"mrtd": {"expected": "` + hex48 + `", "expected": "` + hex48 + `"}}`, wantErr: "mrtd.expected: appears twice"},
		"not hex":                {in: `{"mrtd": {"expected": "zz"}}`, wantErr: "mrtd.expected: is not hex"},
		"odd hex":                {in: `{"mrtd": {"expected": "123"}}`, wantErr: "mrtd.expected: is not hex"},
		"number for hex":         {in: `{"mrtd": {"expected": 12}}`, wantErr: "mrtd.expected: must be a hex string"},
		"expected missing":       {in: `{` + mrtd + `, "mrseam": {"warnOnly": true}}`, wantErr: "mrseam.expected: is missing"},
		"warnOnly not a bool":    {in: `{"mrtd": {"expected": "` + hex48 + `", "warnOnly": "yes"}}`, wantErr: "mrtd.warnOnly: must be true or false"},
		"mrtd short":             {in: `{"mrtd": {"expected": "` + hex48[2:] + `"}}`, wantErr: "mrtd.expected has 47 bytes, want 48"},
		"rtmr2 long":             {in: `{` + mrtd + `, "rtmr2": {"expected": "` + hex48 + `00"}}`, wantErr: "rtmr2.expected has 49 bytes, want 48"},
		"mrseam empty":           {in: `{` + mrtd + `, "mrseam": {"expected": ""}}`, wantErr: "mrseam.expected has 0 bytes, want 48"},
		"tdAttributes short":     {in: `{` + mrtd + `, "tdAttributes": {"expected": "00"}}`, wantErr: "tdAttributes.expected has 1 bytes, want 8"},
		"tdAttributes debug":     {in: `{` + mrtd + `, "tdAttributes": {"expected": "0100000000000000"}}`, wantErr: "DEBUG bit"},
		"minimum SVN short":      {in: `{` + mrtd + `, "minimumTeeTcbSvn": {"minimum": "0203"}}`, wantErr: "minimumTeeTcbSvn.minimum has 2 bytes, want 16"},
		"minimum SVN missing":    {in: `{` + mrtd + `, "minimumTeeTcbSvn": {}}`, wantErr: "minimumTeeTcbSvn.minimum: is missing"},
		"QE SVN too big":         {in: `{` + mrtd + `, "minimumQeSvn": {"minimum": 65536}}`, wantErr: "minimumQeSvn.minimum is 65536, above the 65535 a QE SVN can be"},
		"QE SVN negative":        {in: `{` + mrtd + `, "minimumQeSvn": {"minimum": -1}}`, wantErr: "minimumQeSvn.minimum: must be a whole number"},
		"QE SVN fraction":        {in: `{` + mrtd + `, "minimumQeSvn": {"minimum": 1.5}}`, wantErr: "minimumQeSvn.minimum: must be a whole number"},
		"QE SVN string":          {in: `{` + mrtd + `, "minimumQeSvn": {"minimum": "4"}}`, wantErr: "minimumQeSvn.minimum: must be a whole number"},
		"QE SVN missing":         {in: `{` + mrtd + `, "minimumQeSvn": {"warnOnly": true}}`, wantErr: "minimumQeSvn.minimum: is missing"},
		"several problems named": {in: `{"rtmr1": {"expected": "00"}}`, wantErr: "gceLaunchEndorsement instead)\nrtmr1.expected has 1 bytes"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			_, err := ParsePolicy([]byte(tc.in))
			if tc.wantErr == "" {
				if err != nil {
					t.Fatalf("ParsePolicy() = %v", err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("ParsePolicy() = %v, want an error saying %q", err, tc.wantErr)
			}
			if !strings.HasPrefix(err.Error(), "TDX policy: ") {
				t.Errorf("error %q does not say it is about the TDX policy", err)
			}
		})
	}
}

func TestPolicyRoundTrip(t *testing.T) {
	p := realPolicy(t)
	p.RTMR[2].WarnOnly = true
	p.MinimumQESVN = &tee.MinimumVersion{Minimum: 4, WarnOnly: true}
	out, err := json.Marshal(p)
	if err != nil {
		t.Fatal(err)
	}
	got, err := ParsePolicy(out)
	if err != nil {
		t.Fatalf("ParsePolicy(%s) = %v", out, err)
	}
	if !reflect.DeepEqual(got, p) {
		t.Errorf("round trip changed the policy:\n got %+v\nwant %+v", got, p)
	}

	minimal := Policy{MRTD: &tee.Expected{Expected: mustHex(t, hex48)}}
	out, err = json.Marshal(minimal)
	if err != nil {
		t.Fatal(err)
	}
	if want := `{"mrtd":{"expected":"` + hex48 + `"}}`; string(out) != want {
		t.Errorf("Marshal(minimal) = %s, want %s", out, want)
	}

	if _, err := json.Marshal(Policy{}); err == nil {
		t.Error("Marshal accepted a policy without MRTD")
	}
}

// TestPolicyNested checks that a policy inside a larger file is read as
// strictly as on its own.
func TestPolicyNested(t *testing.T) {
	var file struct {
		TDX *Policy `json:"tdx"`
	}
	good := `{"tdx": {"mrtd": {"expected": "` + hex48 + `"}}}`
	if err := json.Unmarshal([]byte(good), &file); err != nil || file.TDX == nil {
		t.Fatalf("Unmarshal(%s) = %v", good, err)
	}
	bad := `{"tdx": {"mrtd": {"expected": "` + hex48 + `", "warnonly": true}}}`
	if err := json.Unmarshal([]byte(bad), &file); err == nil || !strings.Contains(err.Error(), `unknown field "warnonly"`) {
		t.Fatalf("Unmarshal(%s) = %v, want the unknown field named", bad, err)
	}
}

func ExampleParsePolicy() {
	p, err := ParsePolicy([]byte(`{
		"mrtd": {"expected": "` + strings.Repeat("ab", 48) + `"},
		"rtmr1": {"expected": "` + strings.Repeat("cd", 48) + `", "warnOnly": true},
		"minimumTeeTcbSvn": {"minimum": "03000500000000000000000000000000"}
	}`))
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(p.RTMR[1].WarnOnly, p.MinimumTEETCBSVN.Minimum[2])

	_, err = ParsePolicy([]byte(`{"mrtd": {"expected": "ab"}}`))
	fmt.Println(err)
	// Output:
	// true 5
	// TDX policy: mrtd.expected has 1 bytes, want 48 (96 hex digits)
}
