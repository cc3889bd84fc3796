// Package policy is what the owner expects of a node's attestation, as the
// image's measurements file states it: the PCR values (measurements.M)
// and, for the hardware-rooted variants, the hardware section: "sevSnp"
// (package snp) or "tdx" (package tdx). The section decides the variant:
// a file with "sevSnp" admits only gcp-sev-snp nodes, one with neither
// only qemu-vtpm nodes, so a node cannot pass by leaving its hardware
// evidence out.
//
// The JSON form is the PCR object of package measurements with the
// section beside the PCR indexes:
//
//	{"4": {"expected": "<64 hex>"}, "9": {...}, "11": {...},
//	 "sevSnp": {"measurement": {"expected": "<96 hex>"}, ...}}
//
// YAML has the same shape. Decoding is as strict as the measurements'.
package policy

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/orrery-dev/orrery/internal/attestation/measurements"
	"github.com/orrery-dev/orrery/internal/attestation/snp"
	"github.com/orrery-dev/orrery/internal/attestation/tdx"
	"github.com/orrery-dev/orrery/internal/attestation/variant"
)

// Section names in the file.
const (
	SEVSNPKey = "sevSnp"
	TDXKey    = "tdx"
)

// Policy is what a node's attestation must show.
type Policy struct {
	// PCRs are the expected PCR values. Required.
	PCRs measurements.M
	// SEVSNP is the SEV-SNP report's policy; set for gcp-sev-snp.
	SEVSNP *snp.Policy
	// TDX is the TD quote's policy; set for gcp-tdx.
	TDX *tdx.Policy
}

// Variant is the variant a node must attest with to meet p.
func (p Policy) Variant() variant.Variant {
	switch {
	case p.SEVSNP != nil:
		return variant.GCPSEVSNP
	case p.TDX != nil:
		return variant.GCPTDX
	}
	return variant.QEMUVTPM
}

// Validate checks the PCRs and the section, and that there is at most one
// section.
func (p Policy) Validate() error {
	if err := p.PCRs.Validate(); err != nil {
		return err
	}
	if p.SEVSNP != nil && p.TDX != nil {
		return fmt.Errorf("the measurements have both a %q and a %q section: a node is one or the other", SEVSNPKey, TDXKey)
	}
	if p.SEVSNP != nil {
		return p.SEVSNP.Validate()
	}
	if p.TDX != nil {
		return p.TDX.Validate()
	}
	return nil
}

// Copy returns a copy whose PCRs the caller may change.
func (p Policy) Copy() Policy {
	p.PCRs = p.PCRs.Copy()
	return p
}

// MarshalJSON writes the PCRs in numeric order, then the section, so two
// builds of one image give identical files.
func (p Policy) MarshalJSON() ([]byte, error) {
	if err := p.Validate(); err != nil {
		return nil, fmt.Errorf("marshal measurements: %w", err)
	}
	pcrs, err := p.PCRs.MarshalJSON()
	if err != nil {
		return nil, err
	}
	var key string
	var section any
	switch {
	case p.SEVSNP != nil:
		key, section = SEVSNPKey, p.SEVSNP
	case p.TDX != nil:
		key, section = TDXKey, p.TDX
	default:
		return pcrs, nil
	}
	raw, err := json.Marshal(section)
	if err != nil {
		return nil, fmt.Errorf("marshal the %s section: %w", key, err)
	}
	out := bytes.TrimSuffix(pcrs, []byte("}"))
	return fmt.Appendf(out, ",%q:%s}", key, raw), nil
}

// ParseJSON reads a policy in its JSON form and validates it.
func ParseJSON(data []byte) (Policy, error) {
	p, err := parseJSON(data)
	if err != nil {
		return Policy{}, fmt.Errorf("parse measurements: %w", err)
	}
	return p, nil
}

// ParseYAML reads a policy in its YAML form (see measurements.ParseYAML)
// and validates it.
func ParseYAML(data []byte) (Policy, error) {
	j, err := measurements.YAMLToJSON(data)
	if err != nil {
		return Policy{}, fmt.Errorf("parse measurements: %w", err)
	}
	return ParseJSON(j)
}

// ErrTestRootInFile is wrapped by Load's refusal of a file that names an
// SEV-SNP test root.
var ErrTestRootInFile = errors.New("the measurements file names an SEV-SNP test root")

// Load reads a policy from a .json, .yaml or .yml file. A file may not
// name an SEV-SNP test root ("testRoot" in its SEV-SNP section): such a
// file keeps the image's PCRs and launch measurement, so it passes for the
// image's own, and would swap AMD's roots for whoever wrote it. Only the
// owner names a test root, with LoadWithTestRoot. (The cluster's
// measurement sets carry the test root the owner named, and are read with
// ParseJSON.)
func Load(path string) (Policy, error) {
	var parse func([]byte) (Policy, error)
	switch ext := strings.ToLower(filepath.Ext(path)); ext {
	case ".json":
		parse = ParseJSON
	case ".yaml", ".yml":
		parse = ParseYAML
	default:
		return Policy{}, fmt.Errorf("load measurements from %s: unknown file extension %q: name the file .json, .yaml or .yml", path, ext)
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return Policy{}, fmt.Errorf("load measurements: %w", err)
	}
	p, err := parse(data)
	if err != nil {
		return Policy{}, fmt.Errorf("load measurements from %s: %w", path, err)
	}
	if p.SEVSNP != nil && p.SEVSNP.TestRoot != nil {
		return Policy{}, fmt.Errorf("%w (%q in its %q section): %s: a measurements file that travels with an image may not replace AMD's roots; "+
			"use the file 'make image' wrote, and name the local cloud's test root yourself with --snp-test-root", ErrTestRootInFile, "testRoot", SEVSNPKey, path)
	}
	return p, nil
}

// parseJSON splits the top-level object: the sections go to their
// packages' strict decoders, everything else, as one object, to the
// measurements' (which names any key that is no PCR).
func parseJSON(data []byte) (Policy, error) {
	if len(bytes.TrimSpace(data)) == 0 {
		return Policy{}, errors.New("input is empty")
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
		return Policy{}, errors.New(`measurements must be an object mapping PCR indexes to measurements, such as {"4": {"expected": "<hex>"}}`)
	}
	var p Policy
	pcrs := map[string]json.RawMessage{}
	var order []string
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return Policy{}, err
		}
		key, _ := tok.(string)
		var raw json.RawMessage
		if err := dec.Decode(&raw); err != nil {
			return Policy{}, fmt.Errorf("%s: %w", key, err)
		}
		if err := p.take(key, raw, pcrs, &order); err != nil {
			return Policy{}, err
		}
	}
	if _, err := dec.Token(); err != nil {
		return Policy{}, err
	}
	if dec.More() || hasTrailing(dec) {
		return Policy{}, errors.New("trailing data after the measurements")
	}
	var b bytes.Buffer
	b.WriteByte('{')
	for i, k := range order {
		if i > 0 {
			b.WriteByte(',')
		}
		fmt.Fprintf(&b, "%q:%s", k, pcrs[k])
	}
	b.WriteByte('}')
	m, err := measurements.ParseJSON(b.Bytes())
	if err != nil {
		return Policy{}, errors.Unwrap(err)
	}
	p.PCRs = m
	return p, p.Validate()
}

// take puts one top-level member where it belongs.
func (p *Policy) take(key string, raw json.RawMessage, pcrs map[string]json.RawMessage, order *[]string) error {
	switch key {
	case SEVSNPKey:
		if p.SEVSNP != nil {
			return fmt.Errorf("%q appears twice", key)
		}
		s, err := snp.ParsePolicy(raw)
		if err != nil {
			return err
		}
		p.SEVSNP = &s
	case TDXKey:
		if p.TDX != nil {
			return fmt.Errorf("%q appears twice", key)
		}
		t, err := tdx.ParsePolicy(raw)
		if err != nil {
			return err
		}
		p.TDX = &t
	default:
		if _, dup := pcrs[key]; dup {
			return fmt.Errorf("PCR %s appears twice", key)
		}
		pcrs[key] = raw
		*order = append(*order, key)
	}
	return nil
}

func hasTrailing(dec *json.Decoder) bool {
	_, err := dec.Token()
	return err == nil
}

// LoadWithTestRoot is Load, and then, if testRootPath is not empty, puts
// the test root in that file (snp.TestRoot as JSON, as the local cloud
// writes it) into the policy's SEV-SNP section in place of AMD's roots.
// It is how an owner names a test root: the file must say
// "notARealCpu": true, and the policy must have an SEV-SNP section.
func LoadWithTestRoot(path, testRootPath string) (Policy, error) {
	p, err := Load(path)
	if err != nil || testRootPath == "" {
		return p, err
	}
	if p.SEVSNP == nil {
		return Policy{}, fmt.Errorf("a test root is named for SEV-SNP reports, but %s has no %q section, so nodes are not checked as SEV-SNP VMs: use the image's SEV-SNP measurements (measurements-sev-snp.json)", path, SEVSNPKey)
	}
	root, err := readTestRoot(testRootPath)
	if err != nil {
		return Policy{}, err
	}
	section := *p.SEVSNP
	section.TestRoot = &root
	p.SEVSNP = &section
	if err := p.Validate(); err != nil {
		return Policy{}, fmt.Errorf("%s: %w", testRootPath, err)
	}
	return p, nil
}

func readTestRoot(path string) (snp.TestRoot, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return snp.TestRoot{}, fmt.Errorf("read the SEV-SNP test root: %w", err)
	}
	var root snp.TestRoot
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&root); err != nil {
		return snp.TestRoot{}, fmt.Errorf("SEV-SNP test root %s: %w", path, err)
	}
	if dec.More() {
		return snp.TestRoot{}, fmt.Errorf("SEV-SNP test root %s: trailing data", path)
	}
	if !root.NotARealCPU {
		return snp.TestRoot{}, errors.New(`the SEV-SNP test root in ` + path + ` does not say "notARealCpu": true`)
	}
	return root, nil
}
