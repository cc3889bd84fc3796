package metadataserver

import (
	"errors"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/orrery-dev/orrery/internal/metadata"
)

// asCaller makes every request to h look as if it came from remote, as
// the real server sees a VM's address.
func asCaller(h http.Handler, remote string) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		r.RemoteAddr = remote
		h.ServeHTTP(w, r)
	})
}

func newTestClient(t *testing.T, h http.Handler) *metadata.Client {
	t.Helper()
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return &metadata.Client{BaseURL: srv.URL, HTTP: srv.Client()}
}

func TestClient(t *testing.T) {
	h := testHandler(t)
	ctx := t.Context()
	c := newTestClient(t, asCaller(h, "10.42.0.12:50000"))

	self, err := c.Self(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if want := testInstances[0]; self != want {
		t.Errorf("Self() = %+v, want %+v", self, want)
	}

	peers, err := c.Peers(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, p := range peers {
		names = append(names, p.Name)
	}
	if want := []string{"cp-0", "cp-1", "worker-0", "worker-1"}; !slices.Equal(names, want) {
		t.Errorf("Peers() names = %q, want %q", names, want)
	}

	ep, err := c.Endpoint(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if want := netip.MustParseAddrPort("10.42.0.11:6443"); ep != want {
		t.Errorf("Endpoint() = %s, want %s", ep, want)
	}

	hash, err := c.InitSecretHash(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if string(hash) != string(testHash()) {
		t.Errorf("InitSecretHash() = %q, want %q", hash, testHash())
	}

	// A trailing slash on the base URL is fine.
	c.BaseURL += "/"
	if _, err := c.Self(ctx); err != nil {
		t.Errorf("Self() with a trailing slash: %v", err)
	}
}

func TestClientUnknownCaller(t *testing.T) {
	c := newTestClient(t, asCaller(testHandler(t), "10.42.0.99:50000"))
	_, err := c.Self(t.Context())
	var se *metadata.StatusError
	if !errors.As(err, &se) {
		t.Fatalf("Self() = %v, want a *StatusError", err)
	}
	if se.StatusCode != http.StatusNotFound || se.Body != "unknown caller" || se.Path != "/self" {
		t.Errorf("Self() = %+v, want 404 for /self with body %q", se, "unknown caller")
	}
	if !strings.Contains(err.Error(), "404") || !strings.Contains(err.Error(), "unknown caller") {
		t.Errorf("error %q does not name status and reason", err)
	}
}
