package admissions

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/orrery-dev/orrery/internal/attestation"
	"github.com/orrery-dev/orrery/joinservice/internal/apiserver"
)

// fakeAPI keeps ConfigMaps in kube-system the way the API server does for
// create and get.
type fakeAPI struct {
	mu  sync.Mutex
	cms map[string]json.RawMessage
}

func (f *fakeAPI) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	defer f.mu.Unlock()
	const prefix = "/api/v1/namespaces/kube-system/configmaps"
	if r.Header.Get("Authorization") != "Bearer sa" || !strings.HasPrefix(r.URL.Path, prefix) {
		http.Error(w, "forbidden", http.StatusForbidden)
		return
	}
	switch r.Method {
	case http.MethodPost:
		var cm struct {
			Metadata struct{ Name string } `json:"metadata"`
		}
		raw := json.RawMessage{}
		json.NewDecoder(r.Body).Decode(&raw)
		json.Unmarshal(raw, &cm)
		if _, ok := f.cms[cm.Metadata.Name]; ok {
			http.Error(w, `{"reason":"AlreadyExists"}`, http.StatusConflict)
			return
		}
		f.cms[cm.Metadata.Name] = raw
		w.WriteHeader(http.StatusCreated)
	case http.MethodGet:
		raw, ok := f.cms[strings.TrimPrefix(r.URL.Path, prefix+"/")]
		if !ok {
			http.Error(w, `{"reason":"NotFound"}`, http.StatusNotFound)
			return
		}
		w.Write(raw)
	}
}

func newStore(t *testing.T) *Store {
	srv := httptest.NewTLSServer(&fakeAPI{cms: map[string]json.RawMessage{}})
	t.Cleanup(srv.Close)
	return &Store{Conn: &apiserver.Conn{Server: srv.URL, Token: "sa", HTTP: srv.Client()}}
}

const disk = "0B5C1F3E-8D2A-4C6B-9E7F-1A2B3C4D5E6F"

func TestAdmitAndLookup(t *testing.T) {
	s := newStore(t)
	ctx := context.Background()
	w0 := attestation.Instance{Name: "worker-0", ID: "1"}
	if _, found, err := s.Lookup(ctx, disk); found || err != nil {
		t.Fatalf("unknown disk: found %v, %v", found, err)
	}
	if err := s.Admit(ctx, disk, w0); err != nil {
		t.Fatal(err)
	}
	if err := s.Admit(ctx, strings.ToLower(disk), w0); err != nil {
		t.Fatalf("retried join of the same VM: %v", err)
	}
	if got, found, err := s.Lookup(ctx, strings.ToLower(disk)); !found || err != nil || got != w0 {
		t.Fatalf("Lookup = %v, %v, %v", got, found, err)
	}
	// Another VM, even of the same name, cannot take the disk over.
	if err := s.Admit(ctx, disk, attestation.Instance{Name: "worker-0", ID: "2"}); !errors.Is(err, ErrOtherInstance) {
		t.Fatalf("err = %v, want ErrOtherInstance", err)
	}
	if err := s.Admit(ctx, "../x", w0); err == nil {
		t.Fatal("malformed disk UUID recorded")
	}
}

func TestAPIServerRefusal(t *testing.T) {
	s := newStore(t)
	s.Conn.Token = "wrong"
	if err := s.Admit(context.Background(), disk, attestation.Instance{Name: "w", ID: "1"}); err == nil || !strings.Contains(err.Error(), "403") {
		t.Fatalf("err = %v, want the API server's refusal", err)
	}
	if _, _, err := s.Lookup(context.Background(), disk); err == nil || !strings.Contains(err.Error(), "403") {
		t.Fatalf("err = %v, want the API server's refusal", err)
	}
}
