package qemu_test

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	tpmpb "github.com/google/go-tpm-tools/proto/tpm"

	"github.com/orrery-dev/orrery/internal/attestation/qemu"
	"github.com/orrery-dev/orrery/internal/attestation/vtpm"
	"github.com/orrery-dev/orrery/internal/tpm/pcrlog"
)

// FuzzValidate feeds arbitrary bytes to the validator as an attestation
// document from a peer: it must return an error or the user data the
// document binds, never panic. The seed corpus holds a real document from
// a locked node on swtpm and forgeries of it; the validator trusts any AK
// so that mutations reach the quote, log and measurement checks behind the
// AK check.
//
// Run it with a short -fuzzminimizetime: minimizing a new input of the
// seed's size otherwise takes the default 60 s with no progress shown.
func FuzzValidate(f *testing.F) {
	if os.Getenv("ORRERY_WRITE_FUZZ_SEED") != "" {
		// Refreshes the committed seeds: ORRERY_WRITE_FUZZ_SEED=1 go test -run=FuzzValidate
		// Besides a genuine document, forgeries of it that the checks
		// behind the quote must refuse, so that mutations start near them.
		n := newNode(f)
		lock(f, n)
		doc := issue(f, n)
		dir := filepath.Join("testdata", "fuzz", "FuzzValidate")
		writeSeed(f, filepath.Join(dir, "swtpm-document"), doc)
		writeSeed(f, filepath.Join(dir, "resplit-pcrs"), forgeQuote(f, doc, func(q *tpmpb.Quote) {
			recut(f, q.Pcrs.Pcrs, map[uint32]int{14: 64, 16: 0})
		}))
		writeSeed(f, filepath.Join(dir, "no-lock-log-entry"), keepLog(f, doc, func(e pcrlog.Entry) bool { return e.PCR != 15 }))
	}
	v, err := qemu.NewValidator(qemu.ValidatorConfig{Measurements: expectedLocked(), TrustAnyAK: true})
	if err != nil {
		f.Fatal(err)
	}
	f.Add([]byte(`{"attestation":"AA==","userData":"","measurementLog":"e30K"}`))
	f.Add([]byte(`{}`))
	f.Fuzz(func(t *testing.T, raw []byte) {
		userData, err := v.Validate(context.Background(), raw, nonce)
		if err != nil {
			return
		}
		d, err := vtpm.ParseDocument(raw)
		if err != nil {
			t.Fatalf("validator accepted a document that does not parse: %v", err)
		}
		if string(userData) != string(d.UserData) {
			t.Fatal("accepted document returned user data it does not bind")
		}
	})
}

func writeSeed(f *testing.F, path string, data []byte) {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		f.Fatal(err)
	}
	body := "go test fuzz v1\n[]byte(" + quoteGo(data) + ")\n"
	if err := os.WriteFile(path, []byte(body), 0o644); err != nil {
		f.Fatal(err)
	}
}

func BenchmarkIssue(b *testing.B) {
	n := newNode(b)
	ctx := context.Background()
	b.ResetTimer()
	for b.Loop() {
		if _, err := n.issuer.Issue(ctx, userData, nonce); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkValidate(b *testing.B) {
	n := newNode(b)
	v := validator(b, n, expected(), nil)
	doc := issue(b, n)
	ctx := context.Background()
	b.ResetTimer()
	for b.Loop() {
		if _, err := v.Validate(ctx, doc, nonce); err != nil {
			b.Fatal(err)
		}
	}
}
