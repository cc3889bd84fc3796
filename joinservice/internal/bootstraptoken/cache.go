package bootstraptoken

import (
	"context"
	"sync"
	"time"
)

// Cache hands every caller the same bootstrap token while it is fresh, so
// that the join service creates a Secret every few minutes at most, not
// one per join: a burst of joining nodes, or one node retrying, used to
// leave a Secret per call in kube-system. Expired tokens are deleted by
// Kubernetes' tokencleaner controller, which kubeadm enables in the
// controller manager; so at most a few tokens live at once.
//
// Sharing costs nothing in power: every bootstrap token gives the same
// rights (the system:bootstrappers group), and an attested node could
// get a fresh one by asking again.
type Cache struct {
	// Issuer creates the tokens (a *Client). Required.
	Issuer interface {
		CreateToken(ctx context.Context, ttl time.Duration) (string, error)
	}
	// Now is the clock; nil means time.Now.
	Now func() time.Time

	mu      sync.Mutex
	token   string
	ttl     time.Duration
	created time.Time
}

// freshFraction is the part of its lifetime during which a token is handed
// out again: a node always gets at least two thirds of the lifetime it
// asked for (ten minutes of the join service's fifteen).
const freshFraction = 3

// CreateToken returns the current token if it was made for the same ttl
// less than ttl/3 ago, and a new one otherwise. A failure is not cached.
func (c *Cache) CreateToken(ctx context.Context, ttl time.Duration) (string, error) {
	now := time.Now
	if c.Now != nil {
		now = c.Now
	}
	// Held across the API call: concurrent joins wait for one token
	// instead of each creating its own.
	c.mu.Lock()
	defer c.mu.Unlock()
	t := now()
	if c.token != "" && c.ttl == ttl && !t.Before(c.created) && t.Sub(c.created) < ttl/freshFraction {
		return c.token, nil
	}
	token, err := c.Issuer.CreateToken(ctx, ttl)
	if err != nil {
		return "", err
	}
	c.token, c.ttl, c.created = token, ttl, t
	return token, nil
}
