// Package strictjson decodes the JSON of files that decide who gets
// secrets (the owner's hardware policies): member names match exactly,
// and a repeated member, null, an unknown member or trailing data is an
// error naming the member's dotted path. encoding/json's struct decoding
// matches names regardless of case and keeps the last of repeated
// members, which would let a typo or a second value pass unnoticed.
package strictjson

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

// FieldError is a decoding error with the dotted path of the field it
// is about, so a nested error reads "rtmr2.expected: ...".
type FieldError struct {
	Path string
	Err  error
}

func (e *FieldError) Error() string { return e.Path + ": " + e.Err.Error() }
func (e *FieldError) Unwrap() error { return e.Err }

// within puts err under the member key.
func Within(key string, err error) error {
	var fe *FieldError
	if errors.As(err, &fe) {
		return &FieldError{Path: key + "." + fe.Path, Err: fe.Err}
	}
	return &FieldError{Path: key, Err: err}
}

// Object reads data as one JSON object whose members are handed
// to decode by name, and returns the names seen. Unlike encoding/json's
// struct decoding it matches names exactly (not regardless of case) and
// refuses a repeated member, null, and anything after the object: in the
// owner's policy, any of these would let a typo pass unnoticed.
func Object(data []byte, decode map[string]func(json.RawMessage) error) (map[string]bool, error) {
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
			return nil, Within(key, errors.New("appears twice"))
		}
		seen[key] = true
		var raw json.RawMessage
		if err := dec.Decode(&raw); err != nil {
			return nil, Within(key, err)
		}
		if bytes.Equal(raw, []byte("null")) {
			return nil, Within(key, errors.New("is null: leave the field out instead"))
		}
		if err := member(raw); err != nil {
			return nil, Within(key, err)
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

// Hex decodes a hex string member into dst.
func Hex(dst *[]byte) func(json.RawMessage) error {
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

// Bool decodes a boolean member into dst.
func Bool(dst *bool) func(json.RawMessage) error {
	return func(raw json.RawMessage) error {
		if json.Unmarshal(raw, dst) != nil {
			return errors.New("must be true or false")
		}
		return nil
	}
}

// Uint8 decodes an integer member from 0 to 255 into dst.
func Uint8(dst *uint8) func(json.RawMessage) error {
	return func(raw json.RawMessage) error {
		if json.Unmarshal(raw, dst) != nil {
			return errors.New("must be a whole number from 0 to 255")
		}
		return nil
	}
}

// Uint32 decodes a non-negative integer member into dst.
func Uint32(dst *uint32) func(json.RawMessage) error {
	return func(raw json.RawMessage) error {
		if json.Unmarshal(raw, dst) != nil {
			return errors.New("must be a whole number from 0 to 4294967295")
		}
		return nil
	}
}

// String decodes a string member into dst.
func String(dst *string) func(json.RawMessage) error {
	return func(raw json.RawMessage) error {
		if json.Unmarshal(raw, dst) != nil {
			return errors.New("must be a string")
		}
		return nil
	}
}

// Into decodes a member with its own UnmarshalJSON (a nested object).
func Into(dst json.Unmarshaler) func(json.RawMessage) error {
	return func(raw json.RawMessage) error { return dst.UnmarshalJSON(raw) }
}

// New decodes a nested object member, through its type's UnmarshalJSON,
// into a new value that *dst then points to.
func New[T any, PT interface {
	*T
	json.Unmarshaler
}](dst **T) func(json.RawMessage) error {
	return func(raw json.RawMessage) error {
		v := PT(new(T))
		if err := v.UnmarshalJSON(raw); err != nil {
			return err
		}
		*dst = (*T)(v)
		return nil
	}
}

// Required returns an error naming the first of names that seen lacks.
func Required(seen map[string]bool, names ...string) error {
	for _, n := range names {
		if !seen[n] {
			return &FieldError{Path: n, Err: errors.New("is missing")}
		}
	}
	return nil
}
