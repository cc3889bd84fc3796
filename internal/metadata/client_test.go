package metadata

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

func newTestClient(t *testing.T, h http.Handler) *Client {
	t.Helper()
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return &Client{BaseURL: srv.URL, HTTP: srv.Client()}
}

// fixed answers every request with one response.
func fixed(status int, contentType, body string) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if contentType != "" {
			w.Header().Set("Content-Type", contentType)
		}
		w.WriteHeader(status)
		io.WriteString(w, body)
	})
}

const (
	jsonType = "application/json"
	goodSelf = `{"name":"cp-0","role":"control-plane","ip":"10.42.0.10"}`
)

var badAnswerCases = map[string]struct {
	h       http.Handler
	call    func(context.Context, *Client) error
	wantErr string
}{
	"HTML error page": {
		h:       fixed(502, "text/html", "<html><body>Bad Gateway\x00\x01</body></html>"),
		call:    callSelf,
		wantErr: `502 Bad Gateway: "<html><body>Bad Gateway  </body></html>"`,
	},
	"long error body is cut": {
		h:       fixed(500, "text/plain", strings.Repeat("e", 1000)),
		call:    callSelf,
		wantErr: strings.Repeat("e", 200) + `..."`,
	},
	"wrong content type": {
		h:       fixed(200, "text/html", goodSelf),
		call:    callSelf,
		wantErr: `content type "text/html"`,
	},
	"no content type": {
		h:       fixed(200, "", goodSelf),
		call:    callSelf,
		wantErr: "want application/json",
	},
	"content type with charset": {
		h:    fixed(200, "application/json; charset=utf-8", goodSelf),
		call: callSelf,
	},
	"answer over 1 MiB": {
		h:       fixed(200, jsonType, `{"name":"`+strings.Repeat("a", maxResponse)+`"}`),
		call:    callSelf,
		wantErr: "larger than 1048576 bytes",
	},
	"not JSON": {
		h:       fixed(200, jsonType, "name=cp-0"),
		call:    callSelf,
		wantErr: "decode metadata /self",
	},
	"trailing data": {
		h:       fixed(200, jsonType, goodSelf+`{}`),
		call:    callSelf,
		wantErr: "trailing data",
	},
	"bad role": {
		h:       fixed(200, jsonType, `{"name":"cp-0","role":"admin","ip":"10.42.0.10"}`),
		call:    callSelf,
		wantErr: "invalid role",
	},
	"missing ip": {
		h:       fixed(200, jsonType, `{"name":"cp-0","role":"worker"}`),
		call:    callSelf,
		wantErr: "invalid address",
	},
	"duplicate peers": {
		h:       fixed(200, jsonType, "["+goodSelf+","+goodSelf+"]"),
		call:    callPeers,
		wantErr: "appears twice",
	},
	"null peers": {
		h:       fixed(200, jsonType, "null"),
		call:    callPeers,
		wantErr: "no peer list",
	},
	"endpoint without port": {
		h:       fixed(200, jsonType, `{"endpoint":"10.42.0.10"}`),
		call:    callEndpoint,
		wantErr: "invalid endpoint",
	},
	"endpoint port zero": {
		h:       fixed(200, jsonType, `{"endpoint":"10.42.0.10:0"}`),
		call:    callEndpoint,
		wantErr: "invalid endpoint",
	},
	"hash not bcrypt": {
		h:       fixed(200, jsonType, `{"hash":"secret"}`),
		call:    callHash,
		wantErr: "not a bcrypt hash",
	},
}

func TestClientBadAnswers(t *testing.T) {
	for name, tc := range badAnswerCases {
		t.Run(name, func(t *testing.T) {
			c := newTestClient(t, tc.h)
			err := tc.call(t.Context(), c)
			switch {
			case tc.wantErr == "" && err != nil:
				t.Fatalf("error = %v, want none", err)
			case tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)):
				t.Fatalf("error = %v, want one containing %q", err, tc.wantErr)
			}
		})
	}
}

func callSelf(ctx context.Context, c *Client) error     { _, err := c.Self(ctx); return err }
func callPeers(ctx context.Context, c *Client) error    { _, err := c.Peers(ctx); return err }
func callEndpoint(ctx context.Context, c *Client) error { _, err := c.Endpoint(ctx); return err }
func callHash(ctx context.Context, c *Client) error     { _, err := c.InitSecretHash(ctx); return err }

// A request that cannot finish in time ends with the context's error.
func TestClientCanceled(t *testing.T) {
	c := newTestClient(t, fixed(http.StatusOK, "application/json", `{"name":"cp-0","role":"control-plane","ip":"10.42.0.10"}`))
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	if _, err := c.Self(ctx); !errors.Is(err, context.Canceled) {
		t.Errorf("Self() = %v, want %v", err, context.Canceled)
	}
}

func TestClientBadBaseURL(t *testing.T) {
	tests := map[string]string{
		"empty":       "",
		"no scheme":   "169.254.169.254",
		"ftp":         "ftp://169.254.169.254",
		"no host":     "http://",
		"not parsing": "http://[::1",
	}
	for name, base := range tests {
		t.Run(name, func(t *testing.T) {
			c := &Client{BaseURL: base}
			if _, err := c.Self(t.Context()); err == nil || !strings.Contains(err.Error(), "invalid metadata base URL") {
				t.Errorf("Self() = %v, want an invalid base URL error", err)
			}
		})
	}
}
