package snp

import (
	"encoding/json"
	"strings"
	"testing"
)

func TestParsePolicyIsStrict(t *testing.T) {
	m := `"measurement":{"expected":"` + realVCEKMeasurement + `"}`
	good := `{` + m + `,"guestPolicy":{"allowSmt":true},"minimumTcb":{"bootloader":3,"tee":0,"snp":8,"microcode":115,"warnOnly":true},"chipIds":{"allowed":["` + strings.Repeat("ab", 64) + `"]},"minimumReportVersion":{"minimum":2}}`
	p, err := ParsePolicy([]byte(good))
	if err != nil {
		t.Fatal(err)
	}
	if !p.MinimumTCB.WarnOnly || p.MinimumTCB.Microcode != 115 || !p.GuestPolicy.AllowSMT || len(p.ChipIDs.Allowed) != 1 {
		t.Fatalf("read %+v", p)
	}
	back, err := json.Marshal(p)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ParsePolicy(back); err != nil {
		t.Fatalf("own form %s does not parse: %v", back, err)
	}
	for name, in := range map[string]string{
		"a member twice":                  `{` + m + `,` + m + `}`,
		"a member in another case":        `{"Measurement":{"expected":"` + realVCEKMeasurement + `"}}`,
		"an unknown member":               `{` + m + `,"allowDebug":true}`,
		"null":                            `{` + m + `,"guestPolicy":null}`,
		"no measurement":                  `{"guestPolicy":{"allowSmt":true}}`,
		"a short measurement":             `{"measurement":{"expected":"00"}}`,
		"a TCB without its microcode":     `{` + m + `,"minimumTcb":{"bootloader":3,"tee":0,"snp":8}}`,
		"a TCB component above 255":       `{` + m + `,"minimumTcb":{"bootloader":300,"tee":0,"snp":8,"microcode":1}}`,
		"a chip ID that is not hex":       `{` + m + `,"chipIds":{"allowed":["zz"]}}`,
		"a test root not called not real": `{` + m + `,"testRoot":{"notARealCpu":false,"ark":"","ask":""}}`,
		"trailing data":                   `{` + m + `}{}`,
	} {
		if _, err := ParsePolicy([]byte(in)); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}
