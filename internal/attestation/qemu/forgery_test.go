package qemu_test

import (
	"bytes"
	"context"
	"crypto"
	"crypto/sha256"
	"crypto/x509"
	"encoding/json"
	"io"
	"strings"
	"testing"

	"github.com/google/go-tpm-tools/client"
	attestpb "github.com/google/go-tpm-tools/proto/attest"
	tpmpb "github.com/google/go-tpm-tools/proto/tpm"
	"github.com/google/go-tpm-tools/quote"
	"github.com/google/go-tpm/legacy/tpm2"
	"github.com/google/go-tpm/tpmutil"

	"github.com/orrery-dev/orrery/internal/attestation"
	"github.com/orrery-dev/orrery/internal/attestation/measurements"
	"github.com/orrery-dev/orrery/internal/attestation/qemu"
	"github.com/orrery-dev/orrery/internal/attestation/qemu/platformca"
	"github.com/orrery-dev/orrery/internal/attestation/qemu/qemutest"
	"github.com/orrery-dev/orrery/internal/attestation/vtpm"
	"github.com/orrery-dev/orrery/internal/tpm/pcrlog"
)

// The tests in this file are attacks by a node with root: it can extend any
// PCR, edit its logs and rewrite the attestation document around a genuine
// quote, but it cannot make its vTPM sign anything else.

var clusterID = bytes.Repeat([]byte{0xc1}, 32)

// lock extends PCR 15 with the cluster ID, as the node lock does.
func lock(t testing.TB, n *node) {
	t.Helper()
	withTPM(t, n.tpm, func(rw io.ReadWriter) {
		if err := n.log.Measure(rw, 15, clusterID, "node lock: cluster ID"); err != nil {
			t.Fatal(err)
		}
	})
}

// expectedLocked is expected() for a node locked to clusterID.
func expectedLocked() measurements.M {
	m := expected()
	d := sha256.Sum256(clusterID)
	pcr15 := sha256.Sum256(append(make([]byte, 32), d[:]...))
	m[15] = measurements.Measurement{Expected: pcr15[:]}
	return m
}

// recut concatenates the values of PCRs 0-23 in index order, which is all
// the quote's digest covers, and cuts the result again with the given sizes
// (every other PCR keeps 32 bytes).
func recut(t testing.TB, values map[uint32][]byte, sizes map[uint32]int) {
	t.Helper()
	var all []byte
	for i := uint32(0); i < 24; i++ {
		all = append(all, values[i]...)
	}
	for i := uint32(0); i < 24; i++ {
		size, ok := sizes[i]
		if !ok {
			size = 32
		}
		if size > len(all) {
			t.Fatalf("recut: sizes need more bytes than the values have")
		}
		values[i], all = bytes.Clone(all[:size]), all[size:]
	}
	if len(all) != 0 {
		t.Fatalf("recut: sizes leave %d bytes over", len(all))
	}
}

// forgeQuote rewrites the SHA-256 quote of a document.
func forgeQuote(t testing.TB, doc []byte, fn func(q *tpmpb.Quote)) []byte {
	t.Helper()
	return mutateAttestation(t, doc, func(a *attestpb.Attestation) {
		for _, q := range a.Quotes {
			if q.GetPcrs().GetHash() == tpmpb.HashAlgo_SHA256 {
				fn(q)
				return
			}
		}
		t.Fatal("document has no SHA-256 quote")
	})
}

// keepLog replaces the document's measurement log by the entries for which
// keep is true, as a node that edits its log would.
func keepLog(t testing.TB, doc []byte, keep func(pcrlog.Entry) bool) []byte {
	t.Helper()
	return mutateDoc(t, doc, func(d *vtpm.Document) {
		entries, err := pcrlog.Parse(d.MeasurementLog)
		if err != nil {
			t.Fatal(err)
		}
		d.MeasurementLog = nil
		for _, e := range entries {
			if keep(e) {
				d.MeasurementLog = append(d.MeasurementLog, entryLine(t, e)...)
			}
		}
	})
}

func entryLine(t testing.TB, e pcrlog.Entry) []byte {
	t.Helper()
	line, err := json.Marshal(e)
	if err != nil {
		t.Fatal(err)
	}
	return append(line, '\n')
}

// goTPMToolsAccepts reports whether go-tpm-tools' own quote check passes the
// document's SHA-256 quote: a forgery that it passes is a faithful one, whose
// signature and PCR digest still hold.
func goTPMToolsAccepts(t *testing.T, doc []byte) bool {
	t.Helper()
	d, a := attestationOf(t, doc)
	pub, err := tpm2.DecodePublic(a.AkPub)
	if err != nil {
		t.Fatal(err)
	}
	key, err := pub.Key()
	if err != nil {
		t.Fatal(err)
	}
	for _, q := range a.Quotes {
		if q.GetPcrs().GetHash() == tpmpb.HashAlgo_SHA256 {
			return quote.Verify(q, key, attestation.BindingDigest(nonce, d.UserData)) == nil
		}
	}
	return false
}

func validatorFor(t *testing.T, ca *platformca.CA, m measurements.M) *vtpm.Validator {
	t.Helper()
	v, err := qemu.NewValidator(qemu.ValidatorConfig{Measurements: m, PlatformCAs: []*x509.Certificate{ca.Cert}})
	if err != nil {
		t.Fatal(err)
	}
	return v
}

func wantRefused(t *testing.T, v *vtpm.Validator, doc []byte, mentions ...string) {
	t.Helper()
	_, err := v.Validate(context.Background(), doc, nonce)
	if err == nil {
		t.Fatal("forged attestation accepted")
	}
	for _, want := range mentions {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not mention %q", err, want)
		}
	}
}

// TestResplitPCRsRefused moves bytes between the PCR values sent with a
// genuine quote, keeping their concatenation (and so the signed digest).
func TestResplitPCRsRefused(t *testing.T) {
	t.Run("locked node shows PCR 15 as zero", func(t *testing.T) {
		n := newNode(t)
		lock(t, n)
		v := validator(t, n, expected(), nil)
		doc := issue(t, n)
		if _, err := v.Validate(context.Background(), doc, nonce); err == nil {
			t.Fatal("locked node accepted as an unlocked one before any forgery")
		}
		// PCR 14 takes its own value and PCR 15's, PCR 15 shows PCR 16's
		// zero, PCR 16 is empty; the log loses the lock's entry.
		forged := forgeQuote(t, doc, func(q *tpmpb.Quote) { recut(t, q.Pcrs.Pcrs, map[uint32]int{14: 64, 16: 0}) })
		forged = keepLog(t, forged, func(e pcrlog.Entry) bool { return e.PCR != 15 })
		if !goTPMToolsAccepts(t, forged) {
			t.Fatal("forgery broke the quote's signature or digest; the test proves nothing")
		}
		wantRefused(t, v, forged, "PCR 14", "64 bytes", "re-split")
	})

	t.Run("foreign initrd shows the genuine PCR 11", func(t *testing.T) {
		n := qemutest.NewNode(t)
		n.Measure(t, 11, "evil-initrd", "initrd: enter-initrd")
		// The genuine chain of PCR 11, reproduced in PCR 10 without a log
		// entry.
		genuine := sha256.Sum256([]byte("enter-initrd"))
		withTPM(t, n.TPM, func(rw io.ReadWriter) {
			if err := tpm2.PCRExtend(rw, tpmutil.Handle(10), tpm2.AlgSHA256, genuine[:], ""); err != nil {
				t.Fatal(err)
			}
		})
		m := expected()
		delete(m, 12)
		v := validatorFor(t, n.CA, m)
		doc, err := n.Issuer.Issue(context.Background(), userData, nonce)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := v.Validate(context.Background(), doc, nonce); err == nil {
			t.Fatal("foreign initrd accepted before any forgery")
		}
		// PCR 10 is empty, PCR 11 shows PCR 10's value, PCR 12 takes the
		// real PCR 11 and its own; the log claims the genuine initrd.
		forged := forgeQuote(t, doc, func(q *tpmpb.Quote) { recut(t, q.Pcrs.Pcrs, map[uint32]int{10: 0, 12: 64}) })
		forged = mutateDoc(t, forged, func(d *vtpm.Document) {
			d.MeasurementLog = entryLine(t, pcrlog.NewEntry(11, []byte("enter-initrd"), "initrd: enter-initrd", crypto.SHA256))
		})
		if !goTPMToolsAccepts(t, forged) {
			t.Fatal("forgery broke the quote's signature or digest; the test proves nothing")
		}
		wantRefused(t, v, forged, "PCR 10", "0 bytes", "re-split")
	})
}

// TestMisshapenPCRValuesRefused sends values of the wrong length that still
// hash to the signed digest, in PCRs no measurement enforces.
func TestMisshapenPCRValuesRefused(t *testing.T) {
	n := newNode(t)
	v := validator(t, n, expected(), nil)
	tests := map[string]struct {
		sizes    map[uint32]int
		mentions []string
	}{
		"one byte moved from PCR 17 to PCR 16": {map[uint32]int{16: 33, 17: 31}, []string{"PCR 16", "33 bytes"}},
		"PCR 23 absorbs PCR 22":                {map[uint32]int{22: 0, 23: 64}, []string{"PCR 22", "0 bytes"}},
		"half a value shifted across PCR 15":   {map[uint32]int{14: 48, 16: 16}, []string{"PCR 14", "48 bytes"}},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			forged := forgeQuote(t, issue(t, n), func(q *tpmpb.Quote) { recut(t, q.Pcrs.Pcrs, tc.sizes) })
			if !goTPMToolsAccepts(t, forged) {
				t.Fatal("forgery broke the quote's signature or digest; the test proves nothing")
			}
			wantRefused(t, v, forged, tc.mentions...)
		})
	}
}

// TestPCRSelectionMismatchRefused sends values for PCRs that do not exist or
// that the signed quote does not select. go-tpm-tools refuses these too; the
// validator must refuse them itself and say which PCR is wrong.
func TestPCRSelectionMismatchRefused(t *testing.T) {
	n := newNode(t)
	v := validator(t, n, expected(), nil)
	tests := map[string]struct {
		forge    func(t *testing.T, doc []byte) []byte
		mentions []string
	}{
		"PCR 23 sent as PCR 24": {
			func(t *testing.T, doc []byte) []byte {
				return forgeQuote(t, doc, func(q *tpmpb.Quote) {
					q.Pcrs.Pcrs[24] = q.Pcrs.Pcrs[23]
					delete(q.Pcrs.Pcrs, 23)
				})
			},
			[]string{"PCR 24", "does not exist"},
		},
		"extra PCR 31": {
			func(t *testing.T, doc []byte) []byte {
				return forgeQuote(t, doc, func(q *tpmpb.Quote) { q.Pcrs.Pcrs[31] = make([]byte, 32) })
			},
			[]string{"PCR 31", "does not exist"},
		},
		"selected PCR 7 missing": {
			func(t *testing.T, doc []byte) []byte {
				return forgeQuote(t, doc, func(q *tpmpb.Quote) { delete(q.Pcrs.Pcrs, 7) })
			},
			[]string{"PCR 7", "no value was sent"},
		},
		"quote over PCRs 0-15 sent with 24 values": {
			func(t *testing.T, doc []byte) []byte {
				partial := quoteSelection(t, n, tpm2.PCRSelection{Hash: tpm2.AlgSHA256, PCRs: []int{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15}})
				return forgeQuote(t, doc, func(q *tpmpb.Quote) {
					q.Quote, q.RawSig = partial.Quote, partial.RawSig
				})
			},
			[]string{"PCR 16", "does not cover"},
		},
		"SHA-1 quote sent with SHA-256 values": {
			func(t *testing.T, doc []byte) []byte {
				sha1 := quoteSelection(t, n, client.FullPcrSel(tpm2.AlgSHA1))
				return forgeQuote(t, doc, func(q *tpmpb.Quote) {
					q.Quote, q.RawSig = sha1.Quote, sha1.RawSig
				})
			},
			[]string{"bank"},
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			wantRefused(t, v, tc.forge(t, issue(t, n)), tc.mentions...)
		})
	}
}

// quoteSelection has the node's AK quote sel for this test's nonce and user
// data, as a node with root can.
func quoteSelection(t *testing.T, n *node, sel tpm2.PCRSelection) *tpmpb.Quote {
	t.Helper()
	var q *tpmpb.Quote
	withTPM(t, n.tpm, func(rw io.ReadWriter) {
		ak, err := qemu.LoadAK(rw)
		if err != nil {
			t.Fatal(err)
		}
		defer ak.Close()
		if q, err = ak.Quote(sel, attestation.BindingDigest(nonce, userData)); err != nil {
			t.Fatal(err)
		}
	})
	return q
}

// TestIncompleteMeasurementLogRefused drops the userspace measurement log,
// or the entries that explain PCR 11 or a non-zero PCR 15, from genuine
// attestations whose PCRs match what the verifier expects.
func TestIncompleteMeasurementLogRefused(t *testing.T) {
	locked := newNode(t)
	lock(t, locked)
	v := validator(t, locked, expectedLocked(), nil)
	if _, err := v.Validate(context.Background(), issue(t, locked), nonce); err != nil {
		t.Fatalf("genuine locked node refused: %v", err)
	}
	tests := map[string]struct {
		forge    func(t *testing.T, doc []byte) []byte
		mentions []string
	}{
		"no log": {
			func(t *testing.T, doc []byte) []byte {
				return mutateDoc(t, doc, func(d *vtpm.Document) { d.MeasurementLog = nil })
			},
			[]string{"PCR 11", "no entry"},
		},
		"log without the node lock's entry": {
			func(t *testing.T, doc []byte) []byte {
				return keepLog(t, doc, func(e pcrlog.Entry) bool { return e.PCR != 15 })
			},
			[]string{"PCR 15", "no entry"},
		},
		"log without the initrd's entry": {
			func(t *testing.T, doc []byte) []byte {
				return keepLog(t, doc, func(e pcrlog.Entry) bool { return e.PCR != 11 })
			},
			[]string{"PCR 11", "no entry"},
		},
		"log cut inside the last entry": {
			func(t *testing.T, doc []byte) []byte {
				return mutateDoc(t, doc, func(d *vtpm.Document) { d.MeasurementLog = d.MeasurementLog[:len(d.MeasurementLog)-10] })
			},
			[]string{"measurement log line 2"},
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			wantRefused(t, v, tc.forge(t, issue(t, locked)), tc.mentions...)
		})
	}
}

// TestUnmeasuredNodeNeedsNoLog: PCRs 11 and 15 at their reset value replay
// from an empty log, so a node that measured nothing still attests (to a
// verifier that expects exactly that).
func TestUnmeasuredNodeNeedsNoLog(t *testing.T) {
	n := qemutest.NewNode(t)
	zero := make([]byte, 32)
	v := validatorFor(t, n.CA, measurements.M{11: {Expected: zero}, 15: {Expected: zero}})
	doc, err := n.Issuer.Issue(context.Background(), userData, nonce)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := v.Validate(context.Background(), doc, nonce); err != nil {
		t.Fatalf("unmeasured node refused: %v", err)
	}
}
