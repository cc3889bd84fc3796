// Package setvalidator validates attestations against the cluster's
// accepted measurement sets (internal/records/measurementset), read from the API
// server: a node passes if it matches any set, so nodes of the old and the
// new image join side by side during a rollout. The sets are re-read when
// they are older than the refresh interval, so 'orrery upgrade apply
// --measurements' and '--retire' apply without a restart.
//
// Reading happens during handshakes, before a peer has proved anything,
// so it is bounded: at most one read per interval whatever the number of
// handshakes, and a failed read keeps the sets of the last good one.
//
// What a node must show is not only what a set says: every set is
// validated through JoinPolicy, which enforces PCR 15 as zero (a node
// asks for its ticket before it locks itself to a cluster).
//
// An attestation admits its connection for a while, not for good: the
// join service asks Current before every ticket, which refuses a peer
// whose set was retired since its handshake (once the sets are read
// again, within the refresh interval), and a connection that attested
// longer ago than Config.MaxAge.
package setvalidator

import (
	"cmp"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/orrery-dev/orrery/internal/attestation"
	"github.com/orrery-dev/orrery/internal/attestation/policy"
	"github.com/orrery-dev/orrery/internal/attestation/variant"
	"github.com/orrery-dev/orrery/internal/records/measurementset"
)

// Source lists the accepted sets.
type Source func(ctx context.Context) ([]measurementset.Set, error)

// Factory builds a validator for one set: it is given the set's policy
// with JoinPolicy of its PCRs, not the set's own.
type Factory func(p policy.Policy) (attestation.Validator, error)

// DefaultRefresh is how stale the sets may be: a rollover takes effect
// within it.
const DefaultRefresh = 10 * time.Second

// slowRead is how long a read of the sets may take before it is logged:
// a handshake waits for it, and a node's handshake has a minute in all.
const slowRead = 5 * time.Second

// firstReadRetry is the interval between reads until one succeeds.
const firstReadRetry = time.Second

// DefaultMaxAge is how long an attestation admits its connection. A
// genuine node dials the join service for each ticket and gives up on a
// call after minutes (internal/joinconn), so only a connection kept open
// on purpose gets this old; it must attest again, against the sets and
// the node's PCRs of now.
const DefaultMaxAge = 10 * time.Minute

// matchedCap bounds the memory of which set each peer matched.
const matchedCap = 1024

// Config configures a Validator.
type Config struct {
	// Variant is the variant this validator admits: it uses the sets
	// whose policy is of that variant (policy.Policy.Variant) and leaves
	// the others to the validator of theirs.
	Variant variant.Variant
	Build   Factory
	Source  Source
	// Refresh is how often the sets are read at most; DefaultRefresh if 0.
	Refresh time.Duration
	// MaxAge is how long an attestation admits its connection (see
	// Current); DefaultMaxAge if 0.
	MaxAge time.Duration
	Logger *slog.Logger
	// Now is the clock; time.Now if nil.
	Now func() time.Time
}

// Validator is an attestation.ProofValidator over the cluster's sets.
type Validator struct {
	cfg Config
	log *slog.Logger

	// reading is held by the one goroutine that reads the sets; the
	// others validate against the current ones meanwhile.
	reading sync.Mutex

	mu         sync.Mutex
	lastRead   time.Time
	loaded     bool
	sets       []loadedSet
	matched    map[[32]byte]match
	matchOrder [][32]byte
}

// match is the set a peer's attestation matched, and when.
type match struct {
	set string
	at  time.Time
}

type loadedSet struct {
	name      string
	validator attestation.Validator
}

// New returns a Validator; it reads the sets on first use.
func New(cfg Config) (*Validator, error) {
	if cfg.Build == nil || cfg.Source == nil {
		return nil, errors.New("setvalidator: Build and Source are required")
	}
	if cfg.Refresh == 0 {
		cfg.Refresh = DefaultRefresh
	}
	if cfg.MaxAge == 0 {
		cfg.MaxAge = DefaultMaxAge
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Validator{cfg: cfg, log: log, matched: map[[32]byte]match{}}, nil
}

// Variant implements attestation.Validator.
func (v *Validator) Variant() variant.Variant { return v.cfg.Variant }

// Validate implements attestation.Validator.
func (v *Validator) Validate(ctx context.Context, doc, nonce []byte) ([]byte, error) {
	p, err := v.ValidateProof(ctx, doc, nonce)
	return p.UserData, err
}

// ValidateProof implements attestation.ProofValidator. A refusal
// names, for each set, why the document does not match it.
//
// Each set's validator was built from JoinPolicy(set), not from the set
// alone: PCR 15 must be zero.
func (v *Validator) ValidateProof(ctx context.Context, doc, nonce []byte) (attestation.Proof, error) {
	v.refresh(ctx)
	v.mu.Lock()
	sets, loaded := v.sets, v.loaded
	v.mu.Unlock()
	if !loaded {
		return attestation.Proof{}, errors.New("the join service cannot read the cluster's accepted measurement sets yet (see its log); retry shortly")
	}
	if len(sets) == 0 {
		return attestation.Proof{}, fmt.Errorf("the cluster accepts no %s image: it has no MeasurementSet of that variant (kubectl get measurementsets); add one with 'orrery upgrade apply --measurements'", v.cfg.Variant)
	}
	var reasons []string
	hint := ""
	for _, s := range sets {
		p, err := attestation.ValidateProof(ctx, s.validator, doc, nonce)
		if err == nil {
			v.remember(p.UserData, s.name)
			return p, nil
		}
		reasons = append(reasons, s.name+": "+err.Error())
		hint = cmp.Or(hint, lockedHint(err))
	}
	err := fmt.Errorf("the attestation matches none of the cluster's %d accepted measurement sets: %s%s", len(sets), strings.Join(reasons, "; "), hint)
	if len(sets) == 1 {
		err = fmt.Errorf("the attestation does not match measurement set %s%s", reasons[0], hint)
	}
	v.log.Warn("attestation refused", "variant", v.cfg.Variant.String(), "reason", err.Error())
	return attestation.Proof{}, err
}

// Current returns the name of the set that the attestation binding
// peerKey (the peer's TLS key: the attestation's user data) matched, if
// that attestation still admits its connection:
//   - it is remembered (the last matchedCap attestations are);
//   - it is younger than Config.MaxAge;
//   - its set is still among the accepted ones, read again first if they
//     are older than the refresh interval (as for a handshake), so a set
//     the owner retired stops admitting within that interval.
//
// The error says why not and what the node should do; the join service
// refuses the ticket with it.
func (v *Validator) Current(ctx context.Context, peerKey []byte) (string, error) {
	v.refresh(ctx)
	now := v.cfg.Now()
	v.mu.Lock()
	defer v.mu.Unlock()
	m, ok := v.matched[sha256.Sum256(peerKey)]
	if !ok {
		return "", fmt.Errorf("the join service no longer knows which measurement set this connection attested with (it remembers the last %d attestations): reconnect, which attests again", matchedCap)
	}
	if age := now.Sub(m.at); age > v.cfg.MaxAge {
		return "", fmt.Errorf("this connection attested %s ago, and an attestation admits its connection for %s: reconnect, which attests again", age.Round(time.Second), v.cfg.MaxAge)
	}
	for _, s := range v.sets {
		if s.name == m.set {
			return m.set, nil
		}
	}
	return "", fmt.Errorf("the owner retired measurement set %s, which this connection attested with, so the cluster no longer admits nodes of that image (kubectl get measurementsets lists the accepted ones): upgrade this node to an accepted image, then reconnect", m.set)
}

func (v *Validator) remember(userData []byte, set string) {
	key := sha256.Sum256(userData)
	now := v.cfg.Now()
	v.mu.Lock()
	defer v.mu.Unlock()
	if _, ok := v.matched[key]; !ok {
		v.matchOrder = append(v.matchOrder, key)
	}
	v.matched[key] = match{set: set, at: now}
	for len(v.matchOrder) > matchedCap {
		delete(v.matched, v.matchOrder[0])
		v.matchOrder = v.matchOrder[1:]
	}
}

// refresh reads the sets if they are older than the refresh interval and
// no other goroutine is reading them.
func (v *Validator) refresh(ctx context.Context) {
	if !v.reading.TryLock() {
		return
	}
	defer v.reading.Unlock()
	now := v.cfg.Now()
	v.mu.Lock()
	interval := v.cfg.Refresh
	if !v.loaded {
		// Nothing to validate with yet: retry sooner (a join service
		// that starts before its node's API server answers).
		interval = min(interval, firstReadRetry)
	}
	due := v.lastRead.IsZero() || now.Sub(v.lastRead) >= interval
	if due {
		// Set before reading: a failed read also waits out the
		// interval, so a flood of handshakes cannot hammer the API
		// server.
		v.lastRead = now
	}
	v.mu.Unlock()
	if !due {
		return
	}
	start := time.Now()
	sets, err := v.cfg.Source(ctx)
	if d := time.Since(start); d > slowRead {
		// The handshake that found the sets stale waited for this.
		v.log.Warn("reading the accepted measurement sets from the API server was slow", "took", d.Round(time.Millisecond).String())
	}
	if err != nil && len(sets) == 0 {
		v.log.Error("cannot read the accepted measurement sets; keeping the last ones read", "error", err.Error())
		return
	}
	if err != nil {
		v.log.Error("some measurement sets are invalid and are not accepted", "error", err.Error())
	}
	v.mu.Lock()
	old := map[string]attestation.Validator{}
	for _, s := range v.sets {
		old[s.name] = s.validator
	}
	v.mu.Unlock()
	var loaded []loadedSet
	var names []string
	for _, s := range sets {
		if s.Policy().Variant() != v.cfg.Variant {
			continue
		}
		val, ok := old[s.Name]
		if !ok {
			// Names are derived from the measurements: a known name
			// has the same measurements, and keeps its validator.
			p := s.Policy()
			pcrs, err := JoinPolicy(p.PCRs)
			if err == nil {
				p.PCRs = pcrs
				val, err = v.cfg.Build(p)
			}
			if err != nil {
				v.log.Error("cannot use measurement set", "set", s.Name, "error", err.Error())
				continue
			}
		}
		loaded = append(loaded, loadedSet{name: s.Name, validator: val})
		names = append(names, s.Name)
	}
	v.mu.Lock()
	changed := !v.loaded || len(loaded) != len(v.sets)
	for i := 0; !changed && i < len(loaded); i++ {
		changed = loaded[i].name != v.sets[i].name
	}
	v.sets, v.loaded = loaded, true
	v.mu.Unlock()
	if changed {
		v.log.Info("accepted measurement sets", "sets", strings.Join(names, ","))
	}
}

// CurrentOfAny is Current over the validators of several variants: a
// connection attested with one of them, and that one answers. With none
// that remembers the connection, the first answers (and says so).
func CurrentOfAny(vs ...*Validator) func(ctx context.Context, peerKey []byte) (string, error) {
	return func(ctx context.Context, peerKey []byte) (string, error) {
		key := sha256.Sum256(peerKey)
		for _, v := range vs {
			v.mu.Lock()
			_, ok := v.matched[key]
			v.mu.Unlock()
			if ok {
				return v.Current(ctx, peerKey)
			}
		}
		return vs[0].Current(ctx, peerKey)
	}
}
