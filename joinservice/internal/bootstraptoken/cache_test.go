package bootstraptoken

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"
)

type countingIssuer struct {
	mu    sync.Mutex
	n     int
	fail  bool
	delay time.Duration
}

func (c *countingIssuer) CreateToken(context.Context, time.Duration) (string, error) {
	time.Sleep(c.delay)
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.fail {
		return "", errors.New("API server unavailable")
	}
	c.n++
	return fmt.Sprintf("abcdef.%016d", c.n), nil
}

func (c *countingIssuer) created() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.n
}

// A join per second for half an hour used to create 1,800 Secrets.
func TestCacheBoundsSecrets(t *testing.T) {
	iss := &countingIssuer{}
	now := time.Date(2026, 11, 23, 12, 0, 0, 0, time.UTC)
	c := &Cache{Issuer: iss, Now: func() time.Time { return now }}
	const ttl = 15 * time.Minute
	seen := map[string]time.Time{}
	for range 1800 {
		tok, err := c.CreateToken(context.Background(), ttl)
		if err != nil {
			t.Fatal(err)
		}
		if _, ok := seen[tok]; !ok {
			seen[tok] = now
		}
		if left := seen[tok].Add(ttl).Sub(now); left < 10*time.Minute {
			t.Fatalf("handed out a token with %s left, want at least 10m", left)
		}
		now = now.Add(time.Second)
	}
	if got := iss.created(); got != 6 {
		t.Fatalf("created %d tokens in 30 minutes, want 6 (one per 5 minutes)", got)
	}
}

func TestCacheConcurrentJoinsShareOneToken(t *testing.T) {
	iss := &countingIssuer{delay: 10 * time.Millisecond}
	c := &Cache{Issuer: iss}
	var wg sync.WaitGroup
	for range 20 {
		wg.Go(func() {
			if _, err := c.CreateToken(context.Background(), 15*time.Minute); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	if got := iss.created(); got != 1 {
		t.Fatalf("20 concurrent joins created %d tokens, want 1", got)
	}
}

func TestCacheDoesNotKeepFailuresOrMixLifetimes(t *testing.T) {
	iss := &countingIssuer{fail: true}
	now := time.Date(2026, 11, 23, 12, 0, 0, 0, time.UTC)
	c := &Cache{Issuer: iss, Now: func() time.Time { return now }}
	if _, err := c.CreateToken(context.Background(), 15*time.Minute); err == nil {
		t.Fatal("failure not reported")
	}
	iss.fail = false
	a, err := c.CreateToken(context.Background(), 15*time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	b, err := c.CreateToken(context.Background(), time.Minute)
	if err != nil || a == b {
		t.Fatalf("a one-minute request got the fifteen-minute token %q (%v)", b, err)
	}
	// A clock that went backwards does not stretch a token's reuse.
	now = now.Add(-time.Hour)
	if c2, _ := c.CreateToken(context.Background(), time.Minute); c2 == b {
		t.Fatal("token reused although the clock went back")
	}
}
