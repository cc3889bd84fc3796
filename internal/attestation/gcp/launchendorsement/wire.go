package launchendorsement

import (
	"errors"
	"fmt"
	"math"
	"time"

	"google.golang.org/protobuf/encoding/protowire"
)

// The messages are read with protowire, field by field, rather than
// through generated code: only these few fields matter, each is checked
// for its wire type and size, and a singular field given twice is an
// error rather than "the last one wins". Fields unknown here are skipped,
// so that Google may add some.

// measurementSize is the size of a SHA-384 digest: a launch measurement,
// an MRTD, the firmware's digest.
const measurementSize = 48

type decoder struct {
	typ      protowire.Type
	repeated bool
	// set receives a varint field's value or a bytes field's bytes.
	set func(v uint64, b []byte) error
}

func walk(b []byte, decoders map[protowire.Number]decoder) error {
	seen := map[protowire.Number]bool{}
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return fmt.Errorf("field tag: %w", protowire.ParseError(n))
		}
		b = b[n:]
		d, known := decoders[num]
		if !known {
			n = protowire.ConsumeFieldValue(num, typ, b)
			if n < 0 {
				return fmt.Errorf("field %d: %w", num, protowire.ParseError(n))
			}
			b = b[n:]
			continue
		}
		if typ != d.typ {
			return fmt.Errorf("field %d has wire type %d, not %d", num, typ, d.typ)
		}
		if seen[num] && !d.repeated {
			return fmt.Errorf("field %d is given twice", num)
		}
		seen[num] = true
		var (
			v   uint64
			val []byte
		)
		switch typ {
		case protowire.VarintType:
			v, n = protowire.ConsumeVarint(b)
		default:
			val, n = protowire.ConsumeBytes(b)
		}
		if n < 0 {
			return fmt.Errorf("field %d: %w", num, protowire.ParseError(n))
		}
		b = b[n:]
		if err := d.set(v, val); err != nil {
			return fmt.Errorf("field %d: %w", num, err)
		}
	}
	return nil
}

func bytesField(dst *[]byte) decoder {
	return decoder{typ: protowire.BytesType, set: func(_ uint64, b []byte) error {
		*dst = b
		return nil
	}}
}

// digestField takes a SHA-384 digest.
func digestField(dst *[]byte) decoder {
	return decoder{typ: protowire.BytesType, set: func(_ uint64, b []byte) error {
		if len(b) != measurementSize {
			return fmt.Errorf("%d bytes, not the %d of a SHA-384 digest", len(b), measurementSize)
		}
		*dst = b
		return nil
	}}
}

func uint64Field(dst *uint64) decoder {
	return decoder{typ: protowire.VarintType, set: func(v uint64, _ []byte) error {
		*dst = v
		return nil
	}}
}

func uint32Field(dst *uint32) decoder {
	return decoder{typ: protowire.VarintType, set: func(v uint64, _ []byte) error {
		if v > math.MaxUint32 {
			return fmt.Errorf("%d does not fit a uint32", v)
		}
		*dst = uint32(v)
		return nil
	}}
}

func boolField(dst *bool) decoder {
	return decoder{typ: protowire.VarintType, set: func(v uint64, _ []byte) error {
		if v > 1 {
			return fmt.Errorf("%d is not a bool", v)
		}
		*dst = v == 1
		return nil
	}}
}

func messageField(parse func([]byte) error) decoder {
	return decoder{typ: protowire.BytesType, set: func(_ uint64, b []byte) error { return parse(b) }}
}

// parseEndorsement reads a VMLaunchEndorsement: the signed bytes (1) and
// the signature (2).
func parseEndorsement(b []byte) (signed, signature []byte, err error) {
	err = walk(b, map[protowire.Number]decoder{
		1: bytesField(&signed),
		2: bytesField(&signature),
	})
	switch {
	case err != nil:
		return nil, nil, err
	case len(signed) == 0:
		return nil, nil, errors.New("it holds no golden measurement")
	case len(signature) == 0:
		return nil, nil, errors.New("it holds no signature")
	}
	return signed, signature, nil
}

// goldenFields is a VMGoldenMeasurement as read, before its signer is
// checked.
type goldenFields struct {
	golden Golden
	cert   []byte
}

// parseGolden reads a VMGoldenMeasurement.
func parseGolden(b []byte) (goldenFields, error) {
	var out goldenFields
	g := &out.golden
	var signedSet bool
	err := walk(b, map[protowire.Number]decoder{
		1: messageField(func(b []byte) error {
			t, err := parseTimestamp(b)
			g.Signed, signedSet = t, true
			return err
		}),
		2: uint64Field(&g.Changelist),
		3: bytesField(&g.Commit),
		4: bytesField(&out.cert),
		5: digestField(&g.UEFIDigest),
		// 6, the CA bundle, is skipped: see checkSigner.
		7: messageField(func(b []byte) error {
			s, err := parseSNP(b)
			g.SNP = s
			return err
		}),
		8: messageField(func(b []byte) error {
			t, err := parseTDX(b)
			g.TDX = t
			return err
		}),
	})
	switch {
	case err != nil:
		return goldenFields{}, err
	case !signedSet:
		return goldenFields{}, errors.New("it has no timestamp")
	case g.UEFIDigest == nil:
		return goldenFields{}, errors.New("it names no firmware digest")
	case g.SNP == nil && g.TDX == nil:
		return goldenFields{}, errors.New("it endorses the firmware for neither SEV-SNP nor TDX")
	}
	return out, nil
}

// parseTimestamp reads a google.protobuf.Timestamp.
func parseTimestamp(b []byte) (time.Time, error) {
	var secs, nanos uint64
	err := walk(b, map[protowire.Number]decoder{
		1: uint64Field(&secs),
		2: uint64Field(&nanos),
	})
	if err != nil {
		return time.Time{}, fmt.Errorf("timestamp: %w", err)
	}
	// Seconds are an int64, nanos an int32 in [0, 1e9).
	if nanos >= 1e9 {
		return time.Time{}, fmt.Errorf("timestamp: %d nanoseconds", nanos)
	}
	return time.Unix(int64(secs), int64(nanos)).UTC(), nil
}

// parseSNP reads a VMSevSnp.
func parseSNP(b []byte) (*SNP, error) {
	s := &SNP{Measurements: map[uint32][]byte{}}
	err := walk(b, map[protowire.Number]decoder{
		1: uint32Field(&s.SVN),
		2: {typ: protowire.BytesType, repeated: true, set: func(_ uint64, b []byte) error {
			var vmsas uint32
			var m []byte
			if err := walk(b, map[protowire.Number]decoder{1: uint32Field(&vmsas), 2: digestField(&m)}); err != nil {
				return fmt.Errorf("measurement: %w", err)
			}
			switch {
			case vmsas == 0:
				return errors.New("a measurement for 0 VMSAs")
			case m == nil:
				return fmt.Errorf("no measurement for %d VMSAs", vmsas)
			case s.Measurements[vmsas] != nil:
				return fmt.Errorf("two measurements for %d VMSAs", vmsas)
			}
			s.Measurements[vmsas] = m
			return nil
		}},
		3: bytesField(&s.FamilyID),
		4: bytesField(&s.ImageID),
		5: uint64Field(&s.Policy),
		// 6, a CA bundle for an ID block Google does not use, is skipped.
		7: bytesField(&s.SVSMMeasurement),
	})
	if err != nil {
		return nil, fmt.Errorf("SEV-SNP: %w", err)
	}
	return s, nil
}

// parseTDX reads a VMTdx.
func parseTDX(b []byte) (*TDX, error) {
	t := &TDX{}
	err := walk(b, map[protowire.Number]decoder{
		1: uint32Field(&t.SVN),
		2: {typ: protowire.BytesType, repeated: true, set: func(_ uint64, b []byte) error {
			var m TDXMeasurement
			err := walk(b, map[protowire.Number]decoder{
				1: uint32Field(&m.RAMGiB),
				2: boolField(&m.EarlyAccept),
				3: digestField(&m.MRTD),
			})
			if err != nil {
				return fmt.Errorf("measurement: %w", err)
			}
			if m.MRTD == nil {
				return fmt.Errorf("no MRTD for %d GiB", m.RAMGiB)
			}
			t.Measurements = append(t.Measurements, m)
			return nil
		}},
	})
	if err != nil {
		return nil, fmt.Errorf("TDX: %w", err)
	}
	return t, nil
}
