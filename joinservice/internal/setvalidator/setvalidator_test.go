package setvalidator

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/orrery-dev/orrery/internal/attestation"
	"github.com/orrery-dev/orrery/internal/attestation/measurements"
	"github.com/orrery-dev/orrery/internal/attestation/policy"
	"github.com/orrery-dev/orrery/internal/attestation/snp"
	"github.com/orrery-dev/orrery/internal/attestation/tee"
	"github.com/orrery-dev/orrery/internal/attestation/variant"
	"github.com/orrery-dev/orrery/internal/records/measurementset"
)

// fake accepts a document equal to its expected PCR 4 value, and binds
// the document itself as user data.
type fake struct{ want []byte }

func (f fake) Variant() variant.Variant { return variant.QEMUVTPM }
func (f fake) Validate(_ context.Context, doc, _ []byte) ([]byte, error) {
	if !bytes.Equal(doc, f.want) {
		return nil, errors.New("PCR 4 differs")
	}
	return doc, nil
}
func (f fake) ValidateProof(ctx context.Context, doc, nonce []byte) (attestation.Proof, error) {
	u, err := f.Validate(ctx, doc, nonce)
	return attestation.Proof{UserData: u, Instance: attestation.Instance{Name: "worker-0", ID: "7"}}, err
}

func set(t *testing.T, b byte) measurementset.Set {
	t.Helper()
	s, err := measurementset.New(measurements.M{4: {Expected: bytes.Repeat([]byte{b}, 32)}}, "")
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// cluster is a Source whose sets and failure a test changes.
type cluster struct {
	mu    sync.Mutex
	sets  []measurementset.Set
	err   error
	reads int
}

func (c *cluster) source(context.Context) ([]measurementset.Set, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.reads++
	return c.sets, c.err
}

func (c *cluster) set(sets []measurementset.Set, err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.sets, c.err = sets, err
}

type clock struct{ t time.Time }

func (c *clock) now() time.Time { return c.t }

func newValidator(t *testing.T, c *cluster, clk *clock, builds *int) *Validator {
	t.Helper()
	v, err := New(Config{
		Variant: variant.QEMUVTPM,
		Build: func(p policy.Policy) (attestation.Validator, error) {
			*builds++
			return fake{want: p.PCRs[4].Expected}, nil
		},
		Source: c.source,
		Now:    clk.now,
	})
	if err != nil {
		t.Fatal(err)
	}
	return v
}

func doc(b byte) []byte { return bytes.Repeat([]byte{b}, 32) }

func TestRolloverWithoutRestart(t *testing.T) {
	ctx := context.Background()
	oldSet, newSet := set(t, 1), set(t, 2)
	c := &cluster{sets: []measurementset.Set{oldSet}}
	clk := &clock{t: time.Unix(1000, 0)}
	builds := 0
	v := newValidator(t, c, clk, &builds)

	if p, err := v.ValidateProof(ctx, doc(1), nil); err != nil || p.Instance.Name != "worker-0" {
		t.Fatalf("node of the accepted image refused: %v (instance %v)", err, p.Instance)
	}
	if got, err := v.Current(ctx, doc(1)); got != oldSet.Name || err != nil {
		t.Errorf("Current = %q, %v; want %q", got, err, oldSet.Name)
	}
	_, err := v.Validate(ctx, doc(2), nil)
	if err == nil || !strings.Contains(err.Error(), oldSet.Name) || !strings.Contains(err.Error(), "PCR 4 differs") {
		t.Fatalf("node of another image: err = %v, want the set and the reason named", err)
	}

	// The owner adds the new image's set: it applies once the sets are
	// read again, and not before (no read per handshake).
	c.set([]measurementset.Set{newSet, oldSet}, nil)
	if _, err := v.Validate(ctx, doc(2), nil); err == nil {
		t.Fatal("the sets were read again within the refresh interval")
	}
	clk.t = clk.t.Add(DefaultRefresh)
	if _, err := v.Validate(ctx, doc(2), nil); err != nil {
		t.Fatalf("node of the added image refused: %v", err)
	}
	if _, err := v.Validate(ctx, doc(1), nil); err != nil {
		t.Fatalf("node of the old image refused during the rollout: %v", err)
	}
	if got, err := v.Current(ctx, doc(2)); got != newSet.Name || err != nil {
		t.Errorf("Current = %q, %v; want %q", got, err, newSet.Name)
	}
	if builds != 2 {
		t.Errorf("%d validators built for 2 distinct sets", builds)
	}

	// Retiring the old set refuses its nodes again, naming both reasons
	// when more sets are left... here one set is left.
	c.set([]measurementset.Set{newSet}, nil)
	clk.t = clk.t.Add(DefaultRefresh)
	if _, err := v.Validate(ctx, doc(1), nil); err == nil {
		t.Fatal("node of the retired image admitted")
	}
}

func TestReadFailures(t *testing.T) {
	ctx := context.Background()
	c := &cluster{err: errors.New("connection refused")}
	clk := &clock{t: time.Unix(1000, 0)}
	builds := 0
	v := newValidator(t, c, clk, &builds)

	// Nothing read yet: refused with a reason, and retried a second later
	// rather than on every handshake.
	for range 50 {
		if _, err := v.Validate(ctx, doc(1), nil); err == nil || !strings.Contains(err.Error(), "cannot read") {
			t.Fatalf("err = %v before any set was read", err)
		}
	}
	if c.reads != 1 {
		t.Fatalf("%d reads for 50 handshakes within a second", c.reads)
	}
	c.set([]measurementset.Set{set(t, 1)}, nil)
	clk.t = clk.t.Add(firstReadRetry)
	if _, err := v.Validate(ctx, doc(1), nil); err != nil {
		t.Fatalf("after the API server answered: %v", err)
	}

	// A later failure keeps the last sets.
	c.set(nil, errors.New("timeout"))
	clk.t = clk.t.Add(DefaultRefresh)
	if _, err := v.Validate(ctx, doc(1), nil); err != nil {
		t.Fatalf("a failed read dropped the sets: %v", err)
	}

	// No set at all (every one retired) refuses everyone, saying so.
	c.set(nil, nil)
	clk.t = clk.t.Add(DefaultRefresh)
	if _, err := v.Validate(ctx, doc(1), nil); err == nil || !strings.Contains(err.Error(), "accepts no qemu-vtpm image") {
		t.Fatalf("err = %v with no sets", err)
	}
}

func TestMatchedIsBounded(t *testing.T) {
	c := &cluster{sets: []measurementset.Set{set(t, 1)}}
	builds := 0
	v := newValidator(t, c, &clock{t: time.Unix(1, 0)}, &builds)
	for i := range matchedCap + 10 {
		v.remember([]byte{byte(i), byte(i >> 8)}, "s")
	}
	if len(v.matched) != matchedCap || len(v.matchOrder) != matchedCap {
		t.Fatalf("remembered %d/%d peers, cap %d", len(v.matched), len(v.matchOrder), matchedCap)
	}
	last := matchedCap + 9
	_, oldest := v.matched[sha256.Sum256([]byte{0, 0})]
	newest := v.matched[sha256.Sum256([]byte{byte(last), byte(last >> 8)})]
	if oldest || newest.set != "s" {
		t.Fatal("the oldest peer was not the one forgotten")
	}
}

// An attestation admits its connection only while its set is accepted and
// for MaxAge: a ticket request after that is refused, saying what to do.
func TestCurrent(t *testing.T) {
	ctx := context.Background()
	oldSet, newSet := set(t, 1), set(t, 2)
	tests := map[string]struct {
		// then is what happens between the handshake and the request.
		then    func(c *cluster, clk *clock)
		peer    []byte
		wantSet string
		wantErr []string
	}{
		"set still accepted": {
			then: func(c *cluster, clk *clock) { clk.t = clk.t.Add(time.Minute) }, peer: doc(1), wantSet: oldSet.Name,
		},
		"set retired": {
			then: func(c *cluster, clk *clock) {
				c.set([]measurementset.Set{newSet}, nil)
				clk.t = clk.t.Add(DefaultRefresh)
			},
			peer: doc(1), wantErr: []string{"retired measurement set " + oldSet.Name, "upgrade this node", "reconnect"},
		},
		"set retired and the sets not read again yet": {
			then: func(c *cluster, clk *clock) {
				c.set([]measurementset.Set{newSet}, nil)
				clk.t = clk.t.Add(DefaultRefresh - time.Second)
			},
			peer: doc(1), wantSet: oldSet.Name,
		},
		"every set retired": {
			then: func(c *cluster, clk *clock) {
				c.set(nil, nil)
				clk.t = clk.t.Add(DefaultRefresh)
			},
			peer: doc(1), wantErr: []string{"retired measurement set " + oldSet.Name},
		},
		"attestation as old as MaxAge": {
			then: func(c *cluster, clk *clock) { clk.t = clk.t.Add(DefaultMaxAge) }, peer: doc(1), wantSet: oldSet.Name,
		},
		"attestation older than MaxAge": {
			then: func(c *cluster, clk *clock) { clk.t = clk.t.Add(DefaultMaxAge + time.Second) },
			peer: doc(1), wantErr: []string{"attested 10m1s ago", "reconnect"},
		},
		"peer never attested": {
			then: func(*cluster, *clock) {}, peer: doc(2), wantErr: []string{"no longer knows", "reconnect"},
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			c := &cluster{sets: []measurementset.Set{oldSet}}
			clk := &clock{t: time.Unix(1000, 0)}
			builds := 0
			v := newValidator(t, c, clk, &builds)
			if _, err := v.Validate(ctx, doc(1), nil); err != nil {
				t.Fatal(err)
			}
			tc.then(c, clk)
			got, err := v.Current(ctx, tc.peer)
			if tc.wantErr == nil {
				if err != nil || got != tc.wantSet {
					t.Fatalf("Current = %q, %v; want %q", got, err, tc.wantSet)
				}
				return
			}
			if err == nil || got != "" {
				t.Fatalf("Current = %q, %v; want a refusal", got, err)
			}
			for _, want := range tc.wantErr {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("err = %v, want it to say %q", err, want)
				}
			}
		})
	}
}

// A validator uses only the sets of its variant: a set with an SEV-SNP
// section admits no node through the qemu-vtpm validator, which could
// not check the report the set requires.
func TestSetsOfAnotherVariantAreLeftOut(t *testing.T) {
	ctx := context.Background()
	plain := set(t, 1)
	p := plain.Policy()
	p.SEVSNP = &snp.Policy{Measurement: &tee.Expected{Expected: make([]byte, 48)}}
	hw, err := measurementset.FromPolicy(p, "")
	if err != nil {
		t.Fatal(err)
	}
	var built []policy.Policy
	c := &cluster{sets: []measurementset.Set{hw}}
	v, err := New(Config{
		Variant: variant.QEMUVTPM,
		Build: func(p policy.Policy) (attestation.Validator, error) {
			built = append(built, p)
			return fake{want: p.PCRs[4].Expected}, nil
		},
		Source: c.source,
	})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := v.Validate(ctx, doc(1), nil); err == nil || !strings.Contains(err.Error(), "accepts no qemu-vtpm image") {
		t.Fatalf("a qemu-vtpm node passed a set that requires an SEV-SNP report: %v", err)
	}
	if len(built) != 0 {
		t.Fatalf("built a qemu-vtpm validator for an SEV-SNP set: %+v", built)
	}
}
