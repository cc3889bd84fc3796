package apiserver

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

// A watch's answer, as the API server streams it, and the ways it ends.
func TestWatch(t *testing.T) {
	for name, tc := range map[string]struct {
		status    int
		body      string
		wantTypes string
		wantErr   error
		errText   string
	}{
		"events, then the server ends it": {status: 200, body: `{"type":"ADDED","object":{"a":1}}` + "\n" + `{"type":"MODIFIED","object":{}}` + "\n", wantTypes: "ADDED MODIFIED"},
		"version too old":                 {status: 410, body: `{"kind":"Status"}`, wantErr: ErrWatchExpired},
		"version too old, in the stream":  {status: 200, body: `{"type":"ERROR","object":{"kind":"Status","code":410,"message":"too old resource version"}}` + "\n", wantErr: ErrWatchExpired},
		"another error in the stream":     {status: 200, body: `{"type":"ERROR","object":{"code":500}}` + "\n", errText: "reported an error"},
		"refused":                         {status: 403, body: `forbidden`, errText: "403"},
		"garbage":                         {status: 200, body: "{[\n", errText: "does not parse"},
		"an event larger than allowed":    {status: 200, body: `{"type":"ADDED","object":"` + strings.Repeat("x", maxEvent) + `"}` + "\n", errText: "token too long"},
	} {
		t.Run(name, func(t *testing.T) {
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if r.URL.Query().Get("watch") != "1" || r.Header.Get("Authorization") != "Bearer tok" {
					t.Errorf("request %s, authorization %q", r.URL, r.Header.Get("Authorization"))
				}
				w.WriteHeader(tc.status)
				_, _ = w.Write([]byte(tc.body))
			}))
			defer srv.Close()
			c := &Conn{Server: srv.URL, Token: "tok", HTTP: srv.Client()}
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			var types []string
			err := c.Watch(ctx, "/x?watch=1", func(e Event) error { types = append(types, e.Type); return nil })
			switch {
			case tc.wantErr != nil:
				if !errors.Is(err, tc.wantErr) {
					t.Fatalf("err %v, want %v", err, tc.wantErr)
				}
			case tc.errText != "":
				if err == nil || !strings.Contains(err.Error(), tc.errText) {
					t.Fatalf("err %v, want one that says %q", err, tc.errText)
				}
			default:
				if err != nil || strings.Join(types, " ") != tc.wantTypes {
					t.Fatalf("events %v, err %v; want %s", types, err, tc.wantTypes)
				}
			}
		})
	}
}
