package tdx

import (
	"bytes"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
)

// fieldError is a decoding error with the dotted path of the field it
// is about, so a nested error reads "rtmr2.expected: ...".
type fieldError struct {
	path string
	err  error
}

func (e *fieldError) Error() string { return e.path + ": " + e.err.Error() }
func (e *fieldError) Unwrap() error { return e.err }

// within puts err under the member key.
func within(key string, err error) error {
	var fe *fieldError
	if errors.As(err, &fe) {
		return &fieldError{path: key + "." + fe.path, err: fe.err}
	}
	return &fieldError{path: key, err: err}
}

// decodeObject reads data as one JSON object whose members are handed
// to decode by name, and returns the names seen. Unlike encoding/json's
// struct decoding it matches names exactly (not regardless of case) and
// refuses a repeated member, null, and anything after the object: in the
// owner's policy, any of these would let a typo pass unnoticed.
func decodeObject(data []byte, decode map[string]func(json.RawMessage) error) (map[string]bool, error) {
	dec := json.NewDecoder(bytes.NewReader(data))
	if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
		return nil, errors.New("must be a JSON object")
	}
	seen := map[string]bool{}
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return nil, err
		}
		key, _ := tok.(string)
		member, ok := decode[key]
		if !ok {
			return nil, fmt.Errorf("unknown field %q (known: %s)", key, known(decode))
		}
		if seen[key] {
			return nil, within(key, errors.New("appears twice"))
		}
		seen[key] = true
		var raw json.RawMessage
		if err := dec.Decode(&raw); err != nil {
			return nil, within(key, err)
		}
		if bytes.Equal(raw, []byte("null")) {
			return nil, within(key, errors.New("is null: leave the field out instead"))
		}
		if err := member(raw); err != nil {
			return nil, within(key, err)
		}
	}
	if _, err := dec.Token(); err != nil {
		return nil, err
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, errors.New("trailing data after the object")
	}
	return seen, nil
}

func known(decode map[string]func(json.RawMessage) error) string {
	names := make([]string, 0, len(decode))
	for k := range decode {
		names = append(names, k)
	}
	slices.Sort(names)
	return strings.Join(names, ", ")
}

func hexMember(dst *[]byte) func(json.RawMessage) error {
	return func(raw json.RawMessage) error {
		var s string
		if json.Unmarshal(raw, &s) != nil {
			return errors.New("must be a hex string")
		}
		b, err := hex.DecodeString(s)
		if err != nil {
			return fmt.Errorf("is not hex: %w", err)
		}
		*dst = b
		return nil
	}
}

func boolMember(dst *bool) func(json.RawMessage) error {
	return func(raw json.RawMessage) error {
		if json.Unmarshal(raw, dst) != nil {
			return errors.New("must be true or false")
		}
		return nil
	}
}
