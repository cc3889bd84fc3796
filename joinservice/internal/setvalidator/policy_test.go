package setvalidator

import (
	"bytes"
	"context"
	"crypto/x509"
	"strings"
	"testing"
	"time"

	"github.com/google/go-tpm-tools/client"
	"github.com/google/go-tpm/legacy/tpm2"

	"github.com/orrery-dev/orrery/internal/attestation"
	"github.com/orrery-dev/orrery/internal/attestation/measurements"
	"github.com/orrery-dev/orrery/internal/attestation/policy"
	"github.com/orrery-dev/orrery/internal/attestation/qemu"
	"github.com/orrery-dev/orrery/internal/attestation/qemu/platformca"
	"github.com/orrery-dev/orrery/internal/attestation/qemu/qemutest"
	"github.com/orrery-dev/orrery/internal/attestation/variant"
	"github.com/orrery-dev/orrery/internal/nodelock"
	"github.com/orrery-dev/orrery/internal/records/measurementset"
	"github.com/orrery-dev/orrery/internal/tpm/swtpm/swtpmtest"
)

func digest(b byte) []byte { return bytes.Repeat([]byte{b}, measurements.DigestSize) }

var zero = make([]byte, measurements.DigestSize)

func TestJoinPolicy(t *testing.T) {
	image := measurements.M{4: {Expected: digest(4)}, 9: {Expected: digest(9)}, 11: {Expected: digest(11), WarnOnly: true}}
	with := func(pcr15 measurements.Measurement) measurements.M {
		m := image.Copy()
		m[15] = pcr15
		return m
	}
	tests := map[string]struct {
		m       measurements.M
		wantErr string
	}{
		"set omits PCR 15":             {m: image},
		"set makes PCR 15 warn-only":   {m: with(measurements.Measurement{Expected: zero, WarnOnly: true})},
		"set expects another value":    {m: with(measurements.Measurement{Expected: digest(15)})},
		"set expects zero":             {m: with(measurements.Measurement{Expected: zero})},
		"set enforces only PCR 15":     {m: measurements.M{4: {Expected: digest(4), WarnOnly: true}, 15: {Expected: digest(15)}}, wantErr: "enforces no PCR besides 15"},
		"set enforces nothing":         {m: measurements.M{4: {Expected: digest(4), WarnOnly: true}}, wantErr: "enforces no PCR besides 15"},
		"set is empty":                 {m: measurements.M{}, wantErr: "enforces no PCR besides 15"},
		"set enforces only PCR 15 = 0": {m: measurements.M{15: {Expected: zero}}, wantErr: "enforces no PCR besides 15"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			before := tc.m.Copy()
			got, err := JoinPolicy(tc.m)
			if !tc.m.Equal(before) {
				t.Errorf("JoinPolicy changed its argument: %v, was %v", tc.m, before)
			}
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) || got != nil {
					t.Fatalf("JoinPolicy = %v, %v; want an error containing %q", got, err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			want := image.Copy()
			want[nodelock.PCR] = measurements.Measurement{Expected: zero}
			if !got.Equal(want) {
				t.Errorf("JoinPolicy = %v, want %v", got, want)
			}
		})
	}
}

// pcrValues reads n's SHA-256 values of pcrs.
func pcrValues(t *testing.T, n *qemutest.Node, pcrs ...int) map[uint32][]byte {
	t.Helper()
	rw := swtpmtest.Open(t, n.TPM)
	defer rw.Close()
	values, err := client.ReadPCRs(rw, tpm2.PCRSelection{Hash: tpm2.AlgSHA256, PCRs: pcrs})
	if err != nil {
		t.Fatal(err)
	}
	return values.GetPcrs()
}

// A VM of the accepted image that has locked itself to a cluster (booted
// with some cluster's disk, which it opened) is refused whatever the set
// says of PCR 15, and one that has not is admitted. The quotes come from
// real swtpms and go through the validator the join service builds.
func TestPCR15MustBeZero(t *testing.T) {
	ctx := context.Background()
	ca, err := platformca.New("test platform CA")
	if err != nil {
		t.Fatal(err)
	}
	fresh := qemutest.NewNodeOf(t, ca).Boot(t, "image-a", "uki-a")
	locked := qemutest.NewNodeOf(t, ca).Boot(t, "image-a", "uki-a").Lock(t, "another cluster")
	image := measurements.M{}
	for pcr, v := range pcrValues(t, fresh, 4, 9, 11) {
		image[pcr] = measurements.Measurement{Expected: v}
	}
	lockedPCR15 := pcrValues(t, locked, nodelock.PCR)[nodelock.PCR]
	if bytes.Equal(lockedPCR15, zero) {
		t.Fatal("the locked node's PCR 15 is zero")
	}
	nonce := []byte("nonce of this handshake")
	issue := func(n *qemutest.Node, userData string) []byte {
		doc, err := n.Issuer.Issue(ctx, []byte(userData), nonce)
		if err != nil {
			t.Fatal(err)
		}
		return doc
	}
	freshDoc, lockedDoc := issue(fresh, "fresh node's TLS key"), issue(locked, "locked node's TLS key")

	tests := map[string]*measurements.Measurement{
		"set omits PCR 15":                             nil,
		"set makes PCR 15 warn-only":                   {Expected: zero, WarnOnly: true},
		"set expects the locked node's PCR 15":         {Expected: lockedPCR15},
		"set makes the locked node's PCR 15 warn-only": {Expected: lockedPCR15, WarnOnly: true},
		"set expects zero":                             {Expected: zero},
	}
	for name, pcr15 := range tests {
		t.Run(name, func(t *testing.T) {
			m := image.Copy()
			if pcr15 != nil {
				m[nodelock.PCR] = *pcr15
			}
			s, err := measurementset.New(m, "")
			if err != nil {
				t.Fatal(err)
			}
			v, err := New(Config{
				Variant: variant.QEMUVTPM,
				Build: func(p policy.Policy) (attestation.Validator, error) {
					return qemu.NewValidator(qemu.ValidatorConfig{Measurements: p.PCRs, PlatformCAs: []*x509.Certificate{ca.Cert}})
				},
				Source: (&cluster{sets: []measurementset.Set{s}}).source,
				Now:    (&clock{t: time.Unix(1000, 0)}).now,
			})
			if err != nil {
				t.Fatal(err)
			}
			_, err = v.Validate(ctx, lockedDoc, nonce)
			if err == nil || !strings.Contains(err.Error(), "PCR 15 mismatch") || !strings.Contains(err.Error(), "locked itself to a cluster") {
				t.Fatalf("locked node: err = %v, want a PCR 15 mismatch that says the node is locked", err)
			}
			if _, err := v.Validate(ctx, freshDoc, nonce); err != nil {
				t.Fatalf("a node that has not locked refused: %v", err)
			}
		})
	}
}
