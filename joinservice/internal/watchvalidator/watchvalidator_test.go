package watchvalidator

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/orrery-dev/orrery/internal/attestation"
	"github.com/orrery-dev/orrery/internal/attestation/measurements"
	"github.com/orrery-dev/orrery/internal/attestation/variant"
)

// fake accepts a document equal to its expected PCR 4 value.
type fake struct{ want []byte }

func (f fake) Variant() variant.Variant { return variant.QEMUVTPM }
func (f fake) Validate(_ context.Context, doc, _ []byte) ([]byte, error) {
	if !bytes.Equal(doc, f.want) {
		return nil, errors.New("PCR 4 mismatch")
	}
	return []byte("ok"), nil
}

func write(t *testing.T, path string, b byte) {
	t.Helper()
	m := measurements.M{4: {Expected: bytes.Repeat([]byte{b}, 32)}}
	raw, err := m.MarshalJSON()
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, raw, 0o644); err != nil {
		t.Fatal(err)
	}
}

func TestFollowsFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "measurements.json")
	write(t, path, 1)
	builds := 0
	v, err := New(path, variant.QEMUVTPM, func(m measurements.M) (attestation.Validator, error) {
		builds++
		return fake{want: m[4].Expected}, nil
	}, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if _, err := v.Validate(ctx, bytes.Repeat([]byte{1}, 32), nil); err != nil {
		t.Fatalf("matching node refused: %v", err)
	}
	if _, err := v.Validate(ctx, bytes.Repeat([]byte{1}, 32), nil); err != nil || builds != 1 {
		t.Fatalf("unchanged file rebuilt the validator (%d builds) or refused: %v", builds, err)
	}

	// An update (the ConfigMap changed) applies to the next validation.
	write(t, path, 2)
	if _, err := v.Validate(ctx, bytes.Repeat([]byte{1}, 32), nil); err == nil {
		t.Fatal("node with old measurements accepted after the update")
	}
	if _, err := v.Validate(ctx, bytes.Repeat([]byte{2}, 32), nil); err != nil {
		t.Fatalf("node with new measurements refused: %v", err)
	}

	// A broken update keeps the last good measurements.
	os.WriteFile(path, []byte("{garbage"), 0o644)
	if _, err := v.Validate(ctx, bytes.Repeat([]byte{2}, 32), nil); err != nil {
		t.Fatalf("broken file dropped the good measurements: %v", err)
	}
}

func TestMissingFileAtStart(t *testing.T) {
	_, err := New(filepath.Join(t.TempDir(), "none.json"), variant.QEMUVTPM, nil, nil)
	if err == nil || !strings.Contains(err.Error(), "read measurements") {
		t.Fatalf("err = %v", err)
	}
}

// fakeInstance is a fake that also names the attesting VM.
type fakeInstance struct {
	fake
	inst attestation.Instance
}

func (f fakeInstance) ValidateInstance(ctx context.Context, doc, nonce []byte) ([]byte, attestation.Instance, error) {
	userData, err := f.Validate(ctx, doc, nonce)
	if err != nil {
		return nil, attestation.Instance{}, err
	}
	return userData, f.inst, nil
}

// The join service learns who a node is through this wrapper: it must
// pass the instance on, or every node would be refused as nameless.
func TestPassesInstanceOn(t *testing.T) {
	path := filepath.Join(t.TempDir(), "measurements.json")
	write(t, path, 1)
	vm := attestation.Instance{Name: "worker-0", ID: "42"}
	for name, tc := range map[string]struct {
		build func(measurements.M) attestation.Validator
		want  attestation.Instance
	}{
		"instance validator": {func(m measurements.M) attestation.Validator { return fakeInstance{fake{m[4].Expected}, vm} }, vm},
		"plain validator":    {func(m measurements.M) attestation.Validator { return fake{m[4].Expected} }, attestation.Instance{}},
	} {
		t.Run(name, func(t *testing.T) {
			v, err := New(path, variant.QEMUVTPM, func(m measurements.M) (attestation.Validator, error) { return tc.build(m), nil }, nil)
			if err != nil {
				t.Fatal(err)
			}
			var iv attestation.InstanceValidator = v
			ud, inst, err := iv.ValidateInstance(context.Background(), bytes.Repeat([]byte{1}, 32), nil)
			if err != nil || string(ud) != "ok" || inst != tc.want {
				t.Fatalf("ValidateInstance = %q, %v, %v; want the instance %v", ud, inst, err, tc.want)
			}
			if _, inst, err := iv.ValidateInstance(context.Background(), bytes.Repeat([]byte{2}, 32), nil); err == nil || !inst.IsZero() {
				t.Fatalf("a refused attestation gave %v, %v", inst, err)
			}
		})
	}
}
