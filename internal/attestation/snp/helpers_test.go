package snp

import (
	"io"
	"log/slog"
	"testing"
	"time"

	test "github.com/google/go-sev-guest/testing"
)

func textLogger(w io.Writer) *slog.Logger { return slog.New(slog.NewTextHandler(w, nil)) }

// otherRoot is a test root that signed none of the evidence under test.
func otherRoot(t *testing.T) *TestRoot {
	t.Helper()
	s, err := test.DefaultTestOnlyCertChain("Milan-B1", time.Now())
	if err != nil {
		t.Fatal(err)
	}
	return &TestRoot{NotARealCPU: true, ARK: string(pemCert(s.Ark.Raw)), ASK: string(pemCert(s.Ask.Raw))}
}
