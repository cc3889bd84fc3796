package admissions

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"time"

	"github.com/orrery-dev/orrery/internal/records/admitted"
	"github.com/orrery-dev/orrery/joinservice/internal/apiserver"
)

// A claim makes a node's name or address its disk's in one step: Admit
// checks the records, then writes one, and two joins that race for one
// address could both pass the check before either wrote. The claim is a
// Lease (coordination.k8s.io), created under a name derived from what it
// claims, whose holder is the disk: the API server creates an object
// once, so of two racing joins one gets the claim and the other a
// conflict. Nodes' credentials may write Leases only in kube-node-lease.
const (
	// ClaimNamespace holds the claims.
	ClaimNamespace = "kube-system"
	// claimAnnotation says what a claim claims, for whoever reads it.
	claimAnnotation = "orrery.dev/claims"
	// claimGrace is how long a claim whose disk has no record yet stands:
	// its join is between claiming and recording. A claim older than
	// that without a record is left from a join that failed.
	claimGrace = 2 * time.Minute
	// claimAttempts bounds the retries of one claim that others change
	// between its read and its write.
	claimAttempts = 5
)

// ErrClaimPending is returned by Admit when another disk's join holds a
// claim on the name or an address and has not recorded its node yet.
var ErrClaimPending = errors.New("another node's join is claiming it now")

func leasePath(name string) string {
	p := "/apis/coordination.k8s.io/v1/namespaces/" + ClaimNamespace + "/leases"
	if name != "" {
		p += "/" + url.PathEscape(name)
	}
	return p
}

// claimed is one thing a record claims: a name or an address.
type claimed struct {
	what string // "name worker-0", "address 10.42.1.5"
	// heldBy tells whether other, the record of the claim's holder, still
	// holds it at now.
	heldBy func(other admitted.Record, now time.Time) bool
	// taken is the error for a claim that another record holds.
	taken func(other admitted.Record) error
}

func (c claimed) leaseName() string {
	sum := sha256.Sum256([]byte(c.what))
	return "orrery-claim-" + hex.EncodeToString(sum[:16])
}

// claims are what rec claims: its name, and each of its addresses. A
// claim that another disk of the same VM holds is given up to rec.
func claims(rec admitted.Record) []claimed {
	other := func(o admitted.Record) bool { return o.Instance.ID != rec.Instance.ID }
	cs := []claimed{{
		what: "name " + rec.Instance.Name,
		// A removed node gives up its name at once: the removed list
		// refuses it, and its credentials, anything.
		heldBy: func(o admitted.Record, _ time.Time) bool {
			return other(o) && !o.Removed() && o.Instance.Name == rec.Instance.Name
		},
		taken: func(o admitted.Record) error {
			return fmt.Errorf("%w: %s (state disk %s)", ErrNameTaken, o.Instance, o.DiskUUID)
		},
	}}
	for _, a := range rec.Addresses {
		cs = append(cs, claimed{
			what: "address " + a.String(),
			heldBy: func(o admitted.Record, now time.Time) bool {
				return other(o) && slices.Contains(o.Addresses, a) && addressHeld(o, now)
			},
			taken: func(o admitted.Record) error { return addressTaken(a, o) },
		})
	}
	return cs
}

// lease is the part of a Lease that a claim reads and writes.
type lease struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
	Metadata   struct {
		Name            string            `json:"name"`
		Namespace       string            `json:"namespace,omitempty"`
		ResourceVersion string            `json:"resourceVersion,omitempty"`
		Annotations     map[string]string `json:"annotations,omitempty"`
	} `json:"metadata"`
	Spec struct {
		HolderIdentity string `json:"holderIdentity"`
		AcquireTime    string `json:"acquireTime,omitempty"`
	} `json:"spec"`
}

// claim makes each of rec's claims its disk's, or fails with the error
// that says who holds one. Claims taken before a failure stay with the
// disk: they lapse (claimGrace) if it is never recorded.
func (s *Store) claim(ctx context.Context, rec admitted.Record) error {
	for _, c := range claims(rec) {
		if err := s.claimOne(ctx, rec, c); err != nil {
			return err
		}
	}
	return nil
}

func (s *Store) claimOne(ctx context.Context, rec admitted.Record, c claimed) error {
	var l lease
	l.APIVersion, l.Kind = "coordination.k8s.io/v1", "Lease"
	l.Metadata.Name, l.Metadata.Annotations = c.leaseName(), map[string]string{claimAnnotation: c.what}
	for range claimAttempts {
		l.Spec.HolderIdentity = rec.DiskUUID
		l.Spec.AcquireTime = s.now().UTC().Format("2006-01-02T15:04:05.000000Z07:00")
		code, body, err := s.Conn.Do(ctx, http.MethodPost, leasePath(""), l)
		if err != nil {
			return fmt.Errorf("claim %s: %w", c.what, err)
		}
		switch code {
		case http.StatusCreated:
			return nil
		case http.StatusConflict:
		default:
			return fmt.Errorf("claim %s: API server answered %d %s: %s", c.what, code, http.StatusText(code), apiserver.Excerpt(body))
		}
		have, found, err := s.readClaim(ctx, c)
		if err != nil {
			return err
		}
		if !found {
			continue // deleted since: create it again
		}
		if have.Spec.HolderIdentity == rec.DiskUUID {
			return nil
		}
		if err := s.claimStands(ctx, c, have); err != nil {
			return err
		}
		// The holder gave the claim up: take it over, on the condition
		// that nobody else did since it was read.
		takeOver := map[string]any{
			"metadata": map[string]any{"resourceVersion": have.Metadata.ResourceVersion},
			"spec":     map[string]any{"holderIdentity": rec.DiskUUID, "acquireTime": l.Spec.AcquireTime},
		}
		code, body, err = s.Conn.DoPatch(ctx, leasePath(c.leaseName()), takeOver)
		if err != nil {
			return fmt.Errorf("claim %s: %w", c.what, err)
		}
		switch code {
		case http.StatusOK:
			return nil
		case http.StatusConflict, http.StatusNotFound:
			continue
		default:
			return fmt.Errorf("claim %s: API server answered %d %s: %s", c.what, code, http.StatusText(code), apiserver.Excerpt(body))
		}
	}
	return fmt.Errorf("claim %s: %w", c.what, ErrClaimPending)
}

// claimStands returns the error that says who holds the claim have, or
// nil if its holder gave it up: its disk's record no longer holds what
// it claims, or there has been no record for longer than claimGrace.
func (s *Store) claimStands(ctx context.Context, c claimed, have lease) error {
	holder := have.Spec.HolderIdentity
	if _, err := admitted.Name(holder); err != nil {
		return nil // a holder that is no disk is nobody
	}
	other, found, err := s.Lookup(ctx, holder)
	if err != nil {
		return err
	}
	if found {
		if c.heldBy(other, s.now()) {
			return c.taken(other)
		}
		return nil
	}
	at, err := time.Parse(time.RFC3339Nano, have.Spec.AcquireTime)
	if err != nil || s.now().Sub(at) >= claimGrace {
		return nil
	}
	return fmt.Errorf("%s: %w (state disk %s); try again in a minute", c.what, ErrClaimPending, holder)
}

func (s *Store) readClaim(ctx context.Context, c claimed) (lease, bool, error) {
	code, body, err := s.Conn.Do(ctx, http.MethodGet, leasePath(c.leaseName()), nil)
	if err != nil {
		return lease{}, false, fmt.Errorf("read the claim on %s: %w", c.what, err)
	}
	switch code {
	case http.StatusOK:
	case http.StatusNotFound:
		return lease{}, false, nil
	default:
		return lease{}, false, fmt.Errorf("read the claim on %s: API server answered %d %s: %s", c.what, code, http.StatusText(code), apiserver.Excerpt(body))
	}
	var l lease
	if err := json.Unmarshal(body, &l); err != nil {
		return lease{}, false, fmt.Errorf("decode the claim on %s: %w", c.what, err)
	}
	return l, true, nil
}
