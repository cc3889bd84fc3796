package atls_test

import (
	"context"
	"crypto/tls"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/orrery-dev/orrery/internal/atls"
	"github.com/orrery-dev/orrery/internal/attestation"
)

// TestNotATLSPeerNamed dials servers that are not Orrery nodes: the client
// must say what answered instead of reporting a frame length read from an
// HTTP status line.
func TestNotATLSPeerNamed(t *testing.T) {
	e := newEnv(t)
	handler := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusTeapot) })
	tests := map[string]struct {
		server *httptest.Server
		want   string
	}{
		"HTTP":       {httptest.NewServer(handler), `does not speak TLS: it answered "HTTP/"`},
		"HTTPS":      {httptest.NewTLSServer(handler), "speaks TLS but not gRPC"},
		"TLS and h2": {h2TextServer(t), `speaks TLS but not attested TLS: it answered "HTTP"`},
	}
	for name, tt := range tests {
		t.Run(name, func(t *testing.T) {
			t.Cleanup(tt.server.Close)
			creds, err := atls.NewCredentials(atls.Config{Validators: []attestation.Validator{e.validator(t, e.want)}})
			if err != nil {
				t.Fatal(err)
			}
			raw := dialTCP(t, strings.TrimPrefix(strings.TrimPrefix(tt.server.URL, "https://"), "http://"))
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			_, _, err = creds.ClientHandshake(ctx, "", raw)
			var notATLS *atls.NotATLSError
			if !errors.As(err, &notATLS) {
				t.Fatalf("handshake with an %s server: %v; want a *NotATLSError", name, err)
			}
			if !strings.Contains(err.Error(), tt.want) {
				t.Errorf("error %q lacks %q", err, tt.want)
			}
		})
	}
}

// h2TextServer accepts TLS with gRPC's ALPN protocol and then answers in
// text, as a misconfigured proxy in front of the port would.
func h2TextServer(t *testing.T) *httptest.Server {
	s := httptest.NewUnstartedServer(nil)
	s.Listener = tls.NewListener(s.Listener, &tls.Config{Certificates: []tls.Certificate{selfSigned(t)}, NextProtos: []string{"h2"}})
	s.Config.Handler = nil
	go func() {
		for {
			c, err := s.Listener.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				buf := make([]byte, 512)
				_, _ = c.Read(buf)
				_, _ = c.Write([]byte("HTTP/1.1 400 Bad Request\r\n\r\n"))
			}()
		}
	}()
	s.URL = "https://" + s.Listener.Addr().String()
	return s
}
