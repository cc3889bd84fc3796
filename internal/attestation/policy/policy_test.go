package policy

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/orrery-dev/orrery/internal/attestation/gcp/launchendorsement"
	"github.com/orrery-dev/orrery/internal/attestation/gcp/launchendorsement/endorsementtest"
	"github.com/orrery-dev/orrery/internal/attestation/snp/snpsim"
	"github.com/orrery-dev/orrery/internal/attestation/variant"
)

const (
	pcr4  = `"4":{"expected":"` + "0404040404040404040404040404040404040404040404040404040404040404" + `","warnOnly":false}`
	snpM  = `"sevSnp":{"measurement":{"expected":"` + "6f6f6f6f6f6f6f6f6f6f6f6f6f6f6f6f6f6f6f6f6f6f6f6f6f6f6f6f6f6f6f6f6f6f6f6f6f6f6f6f6f6f6f6f6f6f6f6f" + `"}}`
	plain = `{` + pcr4 + `}`
	withS = `{` + pcr4 + `,` + snpM + `}`
)

func TestVariantFollowsTheSection(t *testing.T) {
	for in, want := range map[string]variant.Variant{plain: variant.QEMUVTPM, withS: variant.GCPSEVSNP} {
		p, err := ParseJSON([]byte(in))
		if err != nil {
			t.Fatalf("%s: %v", in, err)
		}
		if p.Variant() != want {
			t.Errorf("%s: variant %v, want %v", in, p.Variant(), want)
		}
	}
}

func TestRoundTrip(t *testing.T) {
	p, err := ParseJSON([]byte(withS))
	if err != nil {
		t.Fatal(err)
	}
	out, err := p.MarshalJSON()
	if err != nil {
		t.Fatal(err)
	}
	back, err := ParseJSON(out)
	if err != nil {
		t.Fatalf("own output %s does not parse: %v", out, err)
	}
	if !back.PCRs.Equal(p.PCRs) || string(back.SEVSNP.Measurement.Expected) != string(p.SEVSNP.Measurement.Expected) {
		t.Fatalf("round trip changed the policy: %s", out)
	}
	if !strings.HasPrefix(string(out), `{"4":`) {
		t.Errorf("PCRs do not come first: %s", out)
	}
}

func TestYAML(t *testing.T) {
	y := "\"4\":\n  expected: \"0404040404040404040404040404040404040404040404040404040404040404\"\nsevSnp:\n  measurement:\n    expected: \"" + strings.Repeat("6f", 48) + "\"\n  guestPolicy: {allowSmt: true, allowMigrationAgent: false}\n"
	p, err := ParseYAML([]byte(y))
	if err != nil {
		t.Fatal(err)
	}
	if p.Variant() != variant.GCPSEVSNP || p.SEVSNP.GuestPolicy == nil || !p.SEVSNP.GuestPolicy.AllowSMT {
		t.Fatalf("YAML policy read as %+v", p)
	}
}

func TestRefusals(t *testing.T) {
	tests := map[string]string{
		"a misspelt section": `{` + pcr4 + `,"sevsnp":{}}`,
		"a section twice":    `{` + pcr4 + `,` + snpM + `,` + snpM + `}`,
		"a PCR twice":        `{` + pcr4 + `,` + pcr4 + `}`,
		"both sections":      `{` + pcr4 + `,` + snpM + `,"tdx":{}}`,
		"no PCRs":            `{` + snpM + `}`,
		"an SEV-SNP section without a measurement": `{` + pcr4 + `,"sevSnp":{}}`,
		"an unknown SEV-SNP field":                 `{` + pcr4 + `,"sevSnp":{"measurement":{"expected":"` + strings.Repeat("00", 48) + `"},"allowDebug":true}}`,
		"trailing data":                            withS + `{}`,
		"not an object":                            `[]`,
		"empty":                                    ``,
	}
	for name, in := range tests {
		if _, err := ParseJSON([]byte(in)); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

func FuzzParseJSON(f *testing.F) {
	f.Add([]byte(plain))
	f.Add([]byte(withS))
	f.Add([]byte(`{` + pcr4 + `,"tdx":{"mrtd":{"expected":"00"}}}`))
	f.Add([]byte(`{` + pcr4 + `,"sevSnp":{"gceLaunchEndorsement":{"roots":"","minimumSvn":1}}}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		p, err := ParseJSON(data)
		if err != nil {
			return
		}
		out, err := p.MarshalJSON()
		if err != nil {
			t.Fatalf("an accepted policy does not marshal: %v", err)
		}
		if _, err := ParseJSON(out); err != nil {
			t.Fatalf("an accepted policy's own form %s does not parse: %v", out, err)
		}
	})
}

func TestLoadWithTestRoot(t *testing.T) {
	dir := t.TempDir()
	write := func(name, text string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	snpFile := write("m-snp.json", withS)
	plainFile := write("m.json", plain)
	root := write("root.json", `{"notARealCpu": false, "ark": "", "ask": ""}`)
	if _, err := LoadWithTestRoot(snpFile, root); err == nil || !strings.Contains(err.Error(), `"notARealCpu": true`) {
		t.Fatalf("a test root that does not say it is not a real CPU: %v", err)
	}
	if _, err := LoadWithTestRoot(plainFile, root); err == nil || !strings.Contains(err.Error(), "no \"sevSnp\" section") {
		t.Fatalf("a test root for measurements without an SEV-SNP section: %v", err)
	}
	if _, err := LoadWithTestRoot(snpFile, write("junk.json", `{"notARealCpu": true, "extra": 1}`)); err == nil {
		t.Fatal("a test root file with an unknown field was accepted")
	}
	if p, err := LoadWithTestRoot(snpFile, ""); err != nil || p.SEVSNP.TestRoot != nil {
		t.Fatalf("no test root named: %v %+v", err, p.SEVSNP)
	}
}

// TestLoadRefusesATestRootInTheFile: a measurements file that names its
// own SEV-SNP test root keeps the image's PCRs and launch measurement, so
// it passes for the image's file; loading it would let whoever wrote it
// sign the nodes' reports. Only the owner names a test root.
func TestLoadRefusesATestRootInTheFile(t *testing.T) {
	chip, err := snpsim.NewChip(snpsim.Config{})
	if err != nil {
		t.Fatal(err)
	}
	p, err := ParseJSON([]byte(withS))
	if err != nil {
		t.Fatal(err)
	}
	root := chip.TestRoot()
	section := *p.SEVSNP
	section.TestRoot = &root
	p.SEVSNP = &section
	raw, err := p.MarshalJSON()
	if err != nil {
		t.Fatal(err)
	}
	// The cluster's own records may carry it: the owner put it there.
	if _, err := ParseJSON(raw); err != nil {
		t.Fatalf("a policy with a test root does not parse: %v", err)
	}
	path := filepath.Join(t.TempDir(), "measurements-sev-snp.json")
	if err := os.WriteFile(path, raw, 0o644); err != nil {
		t.Fatal(err)
	}
	for name, load := range map[string]func() (Policy, error){
		"Load":                            func() (Policy, error) { return Load(path) },
		"LoadWithTestRoot, none named":    func() (Policy, error) { return LoadWithTestRoot(path, "") },
		"LoadWithTestRoot, another named": func() (Policy, error) { return LoadWithTestRoot(path, writeRoot(t, chip)) },
	} {
		if _, err := load(); !errors.Is(err, ErrTestRootInFile) || !strings.Contains(err.Error(), "--snp-test-root") {
			t.Errorf("%s: %v, want ErrTestRootInFile that names --snp-test-root", name, err)
		}
	}
}

func writeRoot(t *testing.T, chip *snpsim.Chip) string {
	t.Helper()
	raw, err := json.Marshal(chip.TestRoot())
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "root.json")
	if err := os.WriteFile(path, raw, 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// TestGCELaunchEndorsementSections reads a measurements file whose
// hardware sections take Google's launch endorsements instead of a fixed
// measurement, and writes it back the same.
func TestGCELaunchEndorsementSections(t *testing.T) {
	root, err := json.Marshal(endorsementtest.NewAuthority(t, time.Now()).RootPEM)
	if err != nil {
		t.Fatal(err)
	}
	for _, section := range []string{"sevSnp", "tdx"} {
		in := `{` + pcr4 + `,"` + section + `":{"gceLaunchEndorsement":{"roots":` + string(root) + `,"minimumSvn":2}}}`
		p, err := ParseJSON([]byte(in))
		if err != nil {
			t.Fatalf("%s: %v", section, err)
		}
		out, err := p.MarshalJSON()
		if err != nil {
			t.Fatal(err)
		}
		back, err := ParseJSON(out)
		if err != nil {
			t.Fatalf("%s: own output %s does not parse: %v", section, out, err)
		}
		var le *launchendorsement.Policy
		if back.SEVSNP != nil {
			le = back.SEVSNP.GCELaunchEndorsement
		}
		if back.TDX != nil {
			le = back.TDX.GCELaunchEndorsement
		}
		if le == nil || le.MinimumSVN != 2 || !strings.Contains(string(out), `"minimumSvn":2`) {
			t.Errorf("%s: round trip lost the endorsement policy: %s", section, out)
		}
	}
	if _, err := ParseJSON([]byte(`{` + pcr4 + `,"sevSnp":{"gceLaunchEndorsement":{"roots":"not a certificate","minimumSvn":0}}}`)); err == nil || !strings.Contains(err.Error(), "gceLaunchEndorsement.roots") {
		t.Errorf("a root that is not a certificate: %v, want a refusal naming gceLaunchEndorsement.roots", err)
	}
}
