package main

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/orrery-dev/orrery/internal/attestation"
	"github.com/orrery-dev/orrery/internal/attestation/variant"
)

// stepStub takes its time, then answers.
type stepStub struct {
	delay time.Duration
	err   error
}

func (s stepStub) Variant() variant.Variant { return variant.QEMUVTPM }

func (s stepStub) Validate(ctx context.Context, doc, nonce []byte) ([]byte, error) {
	p, err := s.ValidateProof(ctx, doc, nonce)
	return p.UserData, err
}

func (s stepStub) ValidateProof(context.Context, []byte, []byte) (attestation.Proof, error) {
	time.Sleep(s.delay)
	return attestation.Proof{UserData: []byte("key"), Instance: attestation.Instance{ID: "cp-0"}}, s.err
}

// The wrapper keeps what the join path uses (the proof's instance names
// the node a ticket is for), and says so only of a validation that ran long.
func TestTimedValidationLogsOnlySlowOnes(t *testing.T) {
	for _, tc := range []struct {
		name    string
		delay   time.Duration
		err     error
		wantLog []string
	}{
		{"fast", 0, nil, nil},
		{"slow", 30 * time.Millisecond, nil, []string{"was slow", "took=", "failed=false"}},
		{"slow and failed", 30 * time.Millisecond, errors.New("PCR 4 mismatch"), []string{"was slow", "failed=true"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var logs bytes.Buffer
			log := slog.New(slog.NewTextHandler(&logs, nil))
			stub := stepStub{delay: tc.delay, err: tc.err}
			val := timedValidator{ProofValidator: stub, log: log, slow: 20 * time.Millisecond}

			p, err := attestation.ValidateProof(context.Background(), val, nil, nil)
			if p.Instance.ID != "cp-0" || string(p.UserData) != "key" || !errors.Is(err, tc.err) {
				t.Fatalf("ValidateProof through the wrapper lost the proof: %+v, %v", p, err)
			}
			got := logs.String()
			if tc.wantLog == nil && got != "" {
				t.Fatalf("a fast step was logged:\n%s", got)
			}
			for _, w := range tc.wantLog {
				if !strings.Contains(got, w) {
					t.Errorf("want %q in the validation's line:\n%s", w, got)
				}
			}
		})
	}
}
