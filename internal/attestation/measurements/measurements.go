// Package measurements holds the PCR values a node must show in its
// attestation, and reads and writes them.
//
// `make image` predicts the values from the built artefacts and writes them
// as measurements.json; the CLI and the join service load them and compare
// them with what a node's quote reports. The JSON form is
//
//	{"4": {"expected": "<64 hex digits>", "warnOnly": false}, "11": {...}}
//
// with decimal PCR indexes as keys and the hex of a SHA-256 digest as
// expected value. YAML has the same shape.
//
// Decoding is strict, because the file decides which nodes get the
// cluster's secrets: unknown fields, duplicate PCRs, PCRs outside 0-23,
// and values that are not 32 bytes are all errors, and an empty set is
// rejected since it would let any node pass.
package measurements

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"sigs.k8s.io/yaml"
)

const (
	// NumPCRs is the number of PCRs in a TPM 2.0 bank; valid indexes are
	// 0 to NumPCRs-1.
	NumPCRs = 24
	// DigestSize is the size of an expected value: we measure into the
	// SHA-256 bank.
	DigestSize = sha256.Size
)

// Measurement is the value one PCR must have.
type Measurement struct {
	// Expected is the SHA-256 digest the PCR must hold.
	Expected []byte
	// WarnOnly reports a differing PCR to the caller instead of rejecting
	// the node. The zero value enforces, so a forgotten field fails safe.
	WarnOnly bool
}

// M maps PCR indexes to their expected values.
type M map[uint32]Measurement

// measurementJSON is the wire form of a Measurement.
type measurementJSON struct {
	Expected string `json:"expected"`
	WarnOnly bool   `json:"warnOnly"`
}

// MarshalJSON writes the expected value as lowercase hex.
func (m Measurement) MarshalJSON() ([]byte, error) {
	if err := checkExpected(m.Expected); err != nil {
		return nil, err
	}
	return json.Marshal(measurementJSON{Expected: hex.EncodeToString(m.Expected), WarnOnly: m.WarnOnly})
}

// UnmarshalJSON reads a measurement strictly. It does not go through
// encoding/json's struct decoding, which matches field names without
// regard to case and keeps the last of duplicate fields: in this file
// either would let a typo or a second value pass unnoticed.
func (m *Measurement) UnmarshalJSON(data []byte) error {
	if isNull(data) {
		// What encoding/json does for null: leave the value alone.
		return nil
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	if err := expectDelim(dec, '{'); err != nil {
		return errors.New(`a measurement must be an object such as {"expected": "<hex>", "warnOnly": false}`)
	}
	var got Measurement
	seen := map[string]bool{}
	for dec.More() {
		key, err := objectKey(dec)
		if err != nil {
			return err
		}
		if seen[key] {
			return fmt.Errorf("field %q appears twice", key)
		}
		seen[key] = true
		tok, err := dec.Token()
		if err != nil {
			return fmt.Errorf("read field %q: %w", key, err)
		}
		switch key {
		case "expected":
			s, ok := tok.(string)
			if !ok {
				return errors.New("expected value must be a hex string (in YAML, put it in quotes)")
			}
			b, err := hex.DecodeString(s)
			if err != nil {
				return fmt.Errorf("expected value is not hex: %w", err)
			}
			got.Expected = b
		case "warnOnly":
			b, ok := tok.(bool)
			if !ok {
				return errors.New("warnOnly must be true or false")
			}
			got.WarnOnly = b
		default:
			return fmt.Errorf(`unknown field %q: a measurement has only "expected" and "warnOnly"`, key)
		}
	}
	if err := expectEnd(dec, '}'); err != nil {
		return err
	}
	if !seen["expected"] {
		return errors.New("expected value is missing")
	}
	if err := checkExpected(got.Expected); err != nil {
		return err
	}
	*m = got
	return nil
}

// MarshalJSON writes the measurements with PCR indexes in numeric order, so
// that two builds of one image produce identical files. It refuses a set
// that Validate rejects, so a file it writes can always be read back.
func (m M) MarshalJSON() ([]byte, error) {
	if err := m.Validate(); err != nil {
		return nil, fmt.Errorf("marshal measurements: %w", err)
	}
	var b bytes.Buffer
	b.WriteByte('{')
	for i, pcr := range m.pcrs() {
		if i > 0 {
			b.WriteByte(',')
		}
		entry, err := m[pcr].MarshalJSON()
		if err != nil {
			return nil, fmt.Errorf("marshal measurements: PCR %d: %w", pcr, err)
		}
		fmt.Fprintf(&b, `"%d":`, pcr)
		b.Write(entry)
	}
	b.WriteByte('}')
	return b.Bytes(), nil
}

// UnmarshalJSON reads measurements strictly, naming the PCR in every error.
// Unlike encoding/json's map decoding it rejects a PCR that appears twice.
// It does not reject an empty set; ParseJSON, ParseYAML and Load do, via
// Validate.
func (m *M) UnmarshalJSON(data []byte) error {
	if isNull(data) {
		return nil
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	if err := expectDelim(dec, '{'); err != nil {
		return errors.New(`measurements must be an object mapping PCR indexes to measurements, such as {"4": {"expected": "<hex>"}}`)
	}
	out := M{}
	for dec.More() {
		key, err := objectKey(dec)
		if err != nil {
			return err
		}
		pcr, err := parsePCR(key)
		if err != nil {
			return err
		}
		if _, dup := out[pcr]; dup {
			return fmt.Errorf("PCR %d appears twice", pcr)
		}
		var raw json.RawMessage
		if err := dec.Decode(&raw); err != nil {
			return fmt.Errorf("PCR %d: %w", pcr, err)
		}
		var meas Measurement
		if err := meas.UnmarshalJSON(raw); err != nil {
			return fmt.Errorf("PCR %d: %w", pcr, err)
		}
		// Catches null, which Measurement.UnmarshalJSON lets through.
		if err := checkExpected(meas.Expected); err != nil {
			return fmt.Errorf("PCR %d: %w", pcr, err)
		}
		out[pcr] = meas
	}
	if err := expectEnd(dec, '}'); err != nil {
		return err
	}
	*m = out
	return nil
}

// ParseJSON reads measurements in their JSON form and validates them.
func ParseJSON(data []byte) (M, error) {
	m, err := parseJSON(data)
	if err != nil {
		return nil, fmt.Errorf("parse measurements: %w", err)
	}
	return m, nil
}

// ParseYAML reads measurements in their YAML form, the same shape as the
// JSON one, and validates them. Expected values must be quoted: a digest
// that happens to be all decimal digits would otherwise be read as a
// number. PCR keys are read the YAML 1.1 way, so write them without
// leading zeros (010 is octal, PCR 8).
func ParseYAML(data []byte) (M, error) {
	m, err := parseYAML(data)
	if err != nil {
		return nil, fmt.Errorf("parse measurements: %w", err)
	}
	return m, nil
}

// Load reads measurements from a .json, .yaml or .yml file.
func Load(path string) (M, error) {
	var parse func([]byte) (M, error)
	switch ext := strings.ToLower(filepath.Ext(path)); ext {
	case ".json":
		parse = parseJSON
	case ".yaml", ".yml":
		parse = parseYAML
	default:
		return nil, fmt.Errorf("load measurements from %s: unknown file extension %q: name the file .json, .yaml or .yml", path, ext)
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("load measurements: %w", err)
	}
	m, err := parse(data)
	if err != nil {
		return nil, fmt.Errorf("load measurements from %s: %w", path, err)
	}
	return m, nil
}

func parseJSON(data []byte) (M, error) {
	if len(bytes.TrimSpace(data)) == 0 {
		return nil, errors.New("input is empty")
	}
	var m M
	if err := json.Unmarshal(data, &m); err != nil {
		return nil, err
	}
	if err := m.Validate(); err != nil {
		return nil, err
	}
	return m, nil
}

func parseYAML(data []byte) (M, error) {
	j, err := YAMLToJSON(data)
	if err != nil {
		return nil, err
	}
	return parseJSON(j)
}

// YAMLToJSON converts a measurements file's YAML form to its JSON form,
// refusing what the YAML library would silently drop: a second document
// and duplicate keys.
func YAMLToJSON(data []byte) ([]byte, error) {
	if len(bytes.TrimSpace(data)) == 0 {
		return nil, errors.New("input is empty")
	}
	if err := checkSingleDocument(data); err != nil {
		return nil, err
	}
	// The strict conversion rejects duplicate keys, which the JSON we
	// hand on could no longer show.
	j, err := yaml.YAMLToJSONStrict(data)
	if err != nil {
		return nil, fmt.Errorf("not valid YAML: %w", err)
	}
	return j, nil
}

// checkSingleDocument rejects a YAML stream of several documents. The YAML
// library reads the first document and silently ignores the rest, which
// would drop measurements without a word. The YAML spec forbids a line
// starting with "---" or "..." inside any scalar, so looking at line
// starts is exact.
//
// A blind spot remains: text after a flow-style root on the same line,
// as in `{"4": {...}} {"9": {...}}`, is also ignored by the library, and
// finding it would take a YAML parser. Write JSON-style files as .json.
func checkSingleDocument(data []byte) error {
	var started, hasContent, ended bool
	n := 0
	for line := range strings.Lines(string(data)) {
		n++
		line = strings.TrimRight(line, "\r\n")
		trimmed := strings.TrimSpace(line)
		switch {
		case isDocumentMarker(line, "---"):
			if started || hasContent || ended {
				return fmt.Errorf("line %d: a second YAML document starts here: put all measurements in one document", n)
			}
			started = true
			if rest := strings.TrimSpace(line[3:]); rest != "" && !strings.HasPrefix(rest, "#") {
				hasContent = true
			}
		case isDocumentMarker(line, "..."):
			ended = true
		case trimmed == "" || strings.HasPrefix(trimmed, "#"):
		case !started && !hasContent && strings.HasPrefix(line, "%"):
			// A directive such as %YAML 1.1, allowed before the document.
		default:
			if ended {
				return fmt.Errorf("line %d: text after the end of the YAML document: put all measurements in one document", n)
			}
			hasContent = true
		}
	}
	return nil
}

func isDocumentMarker(line, marker string) bool {
	return strings.HasPrefix(line, marker) && (len(line) == len(marker) || line[len(marker)] == ' ' || line[len(marker)] == '\t')
}

// Validate checks that m is not empty, that every PCR index is in range and
// that every expected value is a SHA-256 digest. It reports all problems,
// in PCR order.
func (m M) Validate() error {
	if len(m) == 0 {
		return errors.New("no measurements: at least one PCR must be given, or every node would pass")
	}
	var errs []error
	for _, pcr := range m.pcrs() {
		if pcr >= NumPCRs {
			errs = append(errs, fmt.Errorf("PCR %d: index out of range (valid PCRs are 0-%d)", pcr, NumPCRs-1))
			continue
		}
		if err := checkExpected(m[pcr].Expected); err != nil {
			errs = append(errs, fmt.Errorf("PCR %d: %w", pcr, err))
		}
	}
	return errors.Join(errs...)
}

// Copy returns a deep copy of m, so that a caller can change it without
// changing a set another goroutine compares against.
func (m M) Copy() M {
	if m == nil {
		return nil
	}
	out := make(M, len(m))
	for pcr, meas := range m {
		out[pcr] = Measurement{Expected: bytes.Clone(meas.Expected), WarnOnly: meas.WarnOnly}
	}
	return out
}

// Equal reports whether m and other expect the same PCRs with the same
// values and the same enforcement.
func (m M) Equal(other M) bool {
	if len(m) != len(other) {
		return false
	}
	for pcr, a := range m {
		b, ok := other[pcr]
		if !ok || a.WarnOnly != b.WarnOnly || !bytes.Equal(a.Expected, b.Expected) {
			return false
		}
	}
	return true
}

// pcrs returns m's PCR indexes in ascending order.
func (m M) pcrs() []uint32 {
	pcrs := make([]uint32, 0, len(m))
	for pcr := range m {
		pcrs = append(pcrs, pcr)
	}
	slices.Sort(pcrs)
	return pcrs
}

func checkExpected(b []byte) error {
	switch len(b) {
	case DigestSize:
		return nil
	case 0:
		return errors.New("expected value is missing")
	default:
		return fmt.Errorf("expected value has %d bytes, want %d (SHA-256)", len(b), DigestSize)
	}
}

// parsePCR accepts only the canonical decimal form, so that "4" and "04"
// cannot both name PCR 4.
func parsePCR(key string) (uint32, error) {
	n, err := strconv.ParseUint(key, 10, 32)
	if err != nil || strconv.FormatUint(n, 10) != key {
		return 0, fmt.Errorf("key %q is not a PCR index: want a decimal number from 0 to %d without leading zeros", key, NumPCRs-1)
	}
	if n >= NumPCRs {
		return 0, fmt.Errorf("PCR %d: index out of range (valid PCRs are 0-%d)", n, NumPCRs-1)
	}
	return uint32(n), nil
}

func isNull(data []byte) bool {
	return bytes.Equal(bytes.TrimSpace(data), []byte("null"))
}

func expectDelim(dec *json.Decoder, want json.Delim) error {
	tok, err := dec.Token()
	if err != nil {
		return err
	}
	if d, ok := tok.(json.Delim); !ok || d != want {
		return fmt.Errorf("got %v, want %v", tok, want)
	}
	return nil
}

// expectEnd reads the closing delimiter and makes sure nothing follows it.
func expectEnd(dec *json.Decoder, want json.Delim) error {
	if err := expectDelim(dec, want); err != nil {
		return fmt.Errorf("malformed JSON: %w", err)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return errors.New("malformed JSON: unexpected data after the object")
	}
	return nil
}

func objectKey(dec *json.Decoder) (string, error) {
	tok, err := dec.Token()
	if err != nil {
		return "", fmt.Errorf("malformed JSON: %w", err)
	}
	key, ok := tok.(string)
	if !ok {
		return "", fmt.Errorf("malformed JSON: got %v where a key belongs", tok)
	}
	return key, nil
}
