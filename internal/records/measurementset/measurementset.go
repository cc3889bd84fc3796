// Package measurementset is the form of one accepted node image in the
// cluster: a MeasurementSet object (internal/records/orreryapi) holding the PCR
// values of the image's measurements.json. The join service admits a node
// whose attestation matches any set, so a rollout of a new image adds its
// set beside the old one and retires the old one when no node runs it.
//
// A set's name is derived from its measurements, so the same image always
// makes the same set: adding it twice changes nothing, and the owner and
// every tool name it the same way.
package measurementset

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/orrery-dev/orrery/internal/attestation/measurements"
	"github.com/orrery-dev/orrery/internal/attestation/policy"
	"github.com/orrery-dev/orrery/internal/attestation/snp"
	"github.com/orrery-dev/orrery/internal/attestation/tdx"
	"github.com/orrery-dev/orrery/internal/records/orreryapi"
)

// namePrefix starts every set's name; 16 hex digits of the measurements'
// SHA-256 follow (64 bits: no two images of one cluster collide).
const namePrefix = "image-"

// maxDescription is the CRD's limit.
const maxDescription = 256

// Set is one image's accepted measurements.
type Set struct {
	Name        string
	Description string
	// Measurements enforce at least one PCR.
	Measurements measurements.M
	// SEVSNP and TDX are the hardware section of the image's
	// measurements file, if it has one (see package policy); it decides
	// the variant of the nodes the set admits.
	SEVSNP *snp.Policy
	TDX    *tdx.Policy
}

// Policy is the set as the policy its nodes must meet.
func (s Set) Policy() policy.Policy {
	return policy.Policy{PCRs: s.Measurements.Copy(), SEVSNP: s.SEVSNP, TDX: s.TDX}
}

// New checks m and names the set. A set must enforce at least one PCR: a
// set of warnOnly values would admit any node.
func New(m measurements.M, description string) (Set, error) {
	return FromPolicy(policy.Policy{PCRs: m}, description)
}

// FromPolicy is New for a policy with a hardware section. The name covers
// the section too; a policy without one gets the name New gives its PCRs.
func FromPolicy(p policy.Policy, description string) (Set, error) {
	m := p.PCRs
	if err := p.Validate(); err != nil {
		return Set{}, err
	}
	enforced := false
	for _, v := range m {
		enforced = enforced || !v.WarnOnly
	}
	if !enforced {
		return Set{}, errors.New("the measurements enforce no PCR (every value is warnOnly), so any node would pass: set warnOnly to false for at least PCR 4, 9 and 11")
	}
	if len(description) > maxDescription {
		return Set{}, fmt.Errorf("description is %d bytes, more than %d", len(description), maxDescription)
	}
	raw, err := p.MarshalJSON()
	if err != nil {
		return Set{}, err
	}
	sum := sha256.Sum256(raw)
	return Set{Name: namePrefix + hex.EncodeToString(sum[:8]), Description: description, Measurements: m.Copy(), SEVSNP: p.SEVSNP, TDX: p.TDX}, nil
}

// Values is the set as the orrery-services chart's measurementSets entry.
func (s Set) Values() (map[string]any, error) {
	raw, err := s.Measurements.MarshalJSON()
	if err != nil {
		return nil, err
	}
	var m map[string]any
	if err := json.Unmarshal(raw, &m); err != nil {
		return nil, err
	}
	v := map[string]any{"name": s.Name, "measurements": m}
	if s.Description != "" {
		v["description"] = s.Description
	}
	for key, section := range map[string]any{policy.SEVSNPKey: s.SEVSNP, policy.TDXKey: s.TDX} {
		if err := addSection(v, key, section); err != nil {
			return nil, err
		}
	}
	return v, nil
}

// FromValues reads the chart's measurementSets value (as Helm returns a
// release's values: JSON-shaped any). Each set is checked as New checks
// it, and its name must be the one New gives its measurements: a set
// edited by hand under an old name would mislead whoever retires it.
func FromValues(v any) ([]Set, error) {
	raw, err := json.Marshal(v)
	if err != nil {
		return nil, err
	}
	var items []setJSON
	if err := json.Unmarshal(raw, &items); err != nil {
		return nil, fmt.Errorf("measurementSets value: %w", err)
	}
	var out []Set
	for i, it := range items {
		s, err := it.set()
		if err != nil {
			return nil, fmt.Errorf("measurementSets[%d]: %w", i, err)
		}
		out = append(out, s)
	}
	return out, nil
}

// addSection puts a hardware section into v as JSON-shaped values; a nil
// section adds nothing.
func addSection(v map[string]any, key string, section any) error {
	switch p := section.(type) {
	case *snp.Policy:
		if p == nil {
			return nil
		}
	case *tdx.Policy:
		if p == nil {
			return nil
		}
	}
	raw, err := json.Marshal(section)
	if err != nil {
		return fmt.Errorf("marshal the %s section: %w", key, err)
	}
	var out any
	if err := json.Unmarshal(raw, &out); err != nil {
		return err
	}
	v[key] = out
	return nil
}

// setJSON is both a chart value and an object's spec plus name.
type setJSON struct {
	Name         string          `json:"name"`
	Description  string          `json:"description"`
	Measurements json.RawMessage `json:"measurements"`
	SEVSNP       json.RawMessage `json:"sevSnp,omitempty"`
	TDX          json.RawMessage `json:"tdx,omitempty"`
}

// policyJSON is the set's policy in the measurements file's form: the
// PCR object with the sections beside the PCRs.
func (it setJSON) policyJSON() []byte {
	out := bytes.TrimSpace(it.Measurements)
	for _, sec := range []struct {
		key string
		raw json.RawMessage
	}{{policy.SEVSNPKey, it.SEVSNP}, {policy.TDXKey, it.TDX}} {
		if len(sec.raw) == 0 || string(sec.raw) == "null" || !bytes.HasSuffix(out, []byte("}")) {
			continue
		}
		out = fmt.Appendf(bytes.TrimSuffix(out, []byte("}")), ",%q:%s}", sec.key, sec.raw)
	}
	return out
}

func (it setJSON) set() (Set, error) {
	p, err := policy.ParseJSON(it.policyJSON())
	if err != nil {
		return Set{}, fmt.Errorf("set %q: %w", it.Name, err)
	}
	s, err := FromPolicy(p, it.Description)
	if err != nil {
		return Set{}, fmt.Errorf("set %q: %w", it.Name, err)
	}
	if s.Name != it.Name {
		return Set{}, fmt.Errorf("set %q holds the measurements of %s: its measurements were changed after it was named", it.Name, s.Name)
	}
	return s, nil
}

// maxSets bounds what a list is trusted to hold: a cluster accepts a few
// images at a time, during a rollout.
const maxSets = 64

// ParseList reads an API server's MeasurementSetList. It returns the sets
// that are valid, sorted by name, and an error naming each one that is not
// (the caller decides whether a bad set matters; a join service keeps
// serving with the good ones).
func ParseList(body []byte) ([]Set, error) {
	var list struct {
		APIVersion string `json:"apiVersion"`
		Kind       string `json:"kind"`
		Items      []struct {
			Metadata struct {
				Name string `json:"name"`
			} `json:"metadata"`
			Spec setJSON `json:"spec"`
		} `json:"items"`
	}
	if err := json.Unmarshal(body, &list); err != nil {
		return nil, fmt.Errorf("decode the list of measurement sets: %w", err)
	}
	if list.Kind != orreryapi.MeasurementSetKind+"List" {
		return nil, fmt.Errorf("the API server answered a %.40q, not a %sList", list.Kind, orreryapi.MeasurementSetKind)
	}
	if len(list.Items) > maxSets {
		return nil, fmt.Errorf("the cluster lists %d measurement sets, more than %d: retire the sets of images no node runs", len(list.Items), maxSets)
	}
	var sets []Set
	var errs []error
	for _, it := range list.Items {
		spec := it.Spec
		spec.Name = it.Metadata.Name
		s, err := spec.set()
		if err != nil {
			errs = append(errs, err)
			continue
		}
		sets = append(sets, s)
	}
	slices.SortFunc(sets, func(a, b Set) int { return strings.Compare(a.Name, b.Name) })
	return sets, errors.Join(errs...)
}

// Evidence is how strong the evidence is that a set demands of its
// nodes, weakest first.
type Evidence int

const (
	// EvidenceVTPM is a vTPM quote alone: the host controls the vTPM.
	EvidenceVTPM Evidence = iota
	// EvidenceTestRoot is a hardware report under a test root: whoever
	// holds the root's keys signs any report.
	EvidenceTestRoot
	// EvidenceHardware is a hardware report under the CPU vendor's
	// roots.
	EvidenceHardware
)

func (e Evidence) String() string {
	switch e {
	case EvidenceVTPM:
		return "a vTPM quote alone"
	case EvidenceTestRoot:
		return "a hardware report under a test root"
	}
	return "a hardware report under the CPU vendor's roots"
}

// Evidence is what the set demands.
func (s Set) Evidence() Evidence {
	switch {
	case s.SEVSNP != nil && s.SEVSNP.TestRoot != nil:
		return EvidenceTestRoot
	case s.SEVSNP != nil || s.TDX != nil:
		return EvidenceHardware
	}
	return EvidenceVTPM
}
