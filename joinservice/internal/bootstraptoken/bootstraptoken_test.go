package bootstraptoken

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"testing"
	"time"
)

func TestCreateToken(t *testing.T) {
	var got map[string]any
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost || r.URL.Path != "/api/v1/namespaces/kube-system/secrets" || r.Header.Get("Authorization") != "Bearer sa-token" {
			http.Error(w, "bad request", http.StatusBadRequest)
			return
		}
		json.NewDecoder(r.Body).Decode(&got)
		w.WriteHeader(http.StatusCreated)
	}))
	defer srv.Close()
	now := time.Date(2026, 11, 21, 8, 0, 0, 0, time.UTC)
	c := &Client{Server: srv.URL, Token: "sa-token", HTTP: srv.Client(), Now: func() time.Time { return now }}
	tok, err := c.CreateToken(context.Background(), 15*time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if !regexp.MustCompile(`^[a-z0-9]{6}\.[a-z0-9]{16}$`).MatchString(tok) {
		t.Fatalf("token %q has not kubeadm's form", tok)
	}
	data := got["stringData"].(map[string]any)
	id, secret, _ := strings.Cut(tok, ".")
	if data["token-id"] != id || data["token-secret"] != secret || got["type"] != "bootstrap.kubernetes.io/token" ||
		got["metadata"].(map[string]any)["name"] != "bootstrap-token-"+id {
		t.Fatalf("secret %v does not describe token %s", got, tok)
	}
	if data["expiration"] != "2026-11-21T08:15:00Z" {
		t.Fatalf("expiration %v, want 15 minutes from now", data["expiration"])
	}
}

func TestCreateTokenRefused(t *testing.T) {
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, `{"reason":"Forbidden"}`, http.StatusForbidden)
	}))
	defer srv.Close()
	c := &Client{Server: srv.URL, Token: "x", HTTP: srv.Client()}
	_, err := c.CreateToken(context.Background(), time.Minute)
	if err == nil || !strings.Contains(err.Error(), "403") || !strings.Contains(err.Error(), "Forbidden") {
		t.Fatalf("err = %v", err)
	}
}
