package qemu_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/x509"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	attestpb "github.com/google/go-tpm-tools/proto/attest"
	"github.com/google/go-tpm/legacy/tpm2"
	"github.com/google/go-tpm/tpmutil"
	"google.golang.org/protobuf/proto"

	"github.com/orrery-dev/orrery/internal/attestation/measurements"
	"github.com/orrery-dev/orrery/internal/attestation/qemu"
	"github.com/orrery-dev/orrery/internal/attestation/qemu/platformca"
	"github.com/orrery-dev/orrery/internal/attestation/vtpm"
	"github.com/orrery-dev/orrery/internal/tpm/pcrlog"
	"github.com/orrery-dev/orrery/internal/tpm/swtpm"
	"github.com/orrery-dev/orrery/internal/tpm/swtpm/swtpmtest"
)

// node is a provisioned vTPM with a measurement log, as a booted node has.
type node struct {
	tpm    *swtpm.Instance
	ca     *platformca.CA
	log    *pcrlog.Log
	fwLog  string
	issuer *vtpm.Issuer
}

func newNode(t testing.TB) *node {
	t.Helper()
	n := &node{tpm: swtpmtest.Start(t), log: &pcrlog.Log{Path: filepath.Join(t.TempDir(), "measurements.log")}}
	var err error
	if n.ca, err = platformca.New("test platform CA"); err != nil {
		t.Fatal(err)
	}
	withTPM(t, n.tpm, func(rw io.ReadWriter) {
		if _, err := n.ca.ProvisionAK(rw, platformca.NewInstance("node-0")); err != nil {
			t.Fatalf("provision AK: %v", err)
		}
		if err := n.log.Measure(rw, 11, []byte("enter-initrd"), "initrd: enter-initrd"); err != nil {
			t.Fatal(err)
		}
	})
	n.fwLog = filepath.Join(t.TempDir(), "binary_bios_measurements")
	n.issuer, err = qemu.NewIssuer(qemu.IssuerConfig{OpenTPM: n.tpm.Open, FirmwareEventLogPath: n.fwLog, MeasurementLog: n.log})
	if err != nil {
		t.Fatal(err)
	}
	return n
}

func withTPM(t testing.TB, in *swtpm.Instance, fn func(rw io.ReadWriter)) {
	t.Helper()
	rw, err := in.Open()
	if err != nil {
		t.Fatal(err)
	}
	defer rw.Close()
	fn(rw)
}

// expected returns the measurements of a node that only measured
// "enter-initrd" into PCR 11, computed without the code under test.
func expected() measurements.M {
	zero := make([]byte, 32)
	d := sha256.Sum256([]byte("enter-initrd"))
	pcr11 := sha256.Sum256(append(zero, d[:]...))
	return measurements.M{
		4:  {Expected: zero},
		9:  {Expected: zero},
		11: {Expected: pcr11[:]},
		12: {Expected: zero},
		13: {Expected: zero},
		15: {Expected: zero},
	}
}

func validator(t testing.TB, n *node, m measurements.M, logs io.Writer) *vtpm.Validator {
	t.Helper()
	if logs == nil {
		logs = io.Discard
	}
	v, err := qemu.NewValidator(qemu.ValidatorConfig{
		Measurements: m,
		PlatformCAs:  []*x509.Certificate{n.ca.Cert},
		Logger:       slog.New(slog.NewTextHandler(logs, nil)),
	})
	if err != nil {
		t.Fatal(err)
	}
	return v
}

var (
	nonce    = bytes.Repeat([]byte{0x42}, 32)
	userData = []byte("the attester's TLS public key")
)

func issue(t testing.TB, n *node) []byte {
	t.Helper()
	doc, err := n.issuer.Issue(context.Background(), userData, nonce)
	if err != nil {
		t.Fatalf("Issue: %v", err)
	}
	return doc
}

func TestRoundTrip(t *testing.T) {
	n := newNode(t)
	got, err := validator(t, n, expected(), nil).Validate(context.Background(), issue(t, n), nonce)
	if err != nil {
		t.Fatalf("Validate: %v", err)
	}
	if !bytes.Equal(got, userData) {
		t.Fatalf("user data = %q, want %q", got, userData)
	}
}

func TestEnforcedMismatchNamesPCRAndComponent(t *testing.T) {
	n := newNode(t)
	m := expected()
	wrong := bytes.Repeat([]byte{0xaa}, 32)
	m[11] = measurements.Measurement{Expected: wrong}
	_, err := validator(t, n, m, nil).Validate(context.Background(), issue(t, n), nonce)
	if err == nil {
		t.Fatal("attestation with a wrong PCR 11 was accepted")
	}
	for _, want := range []string{"PCR 11", hex.EncodeToString(wrong), hex.EncodeToString(expected()[11].Expected), "initrd: enter-initrd"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not mention %q", err, want)
		}
	}
}

func TestWarnOnlyMismatchIsAcceptedAndLogged(t *testing.T) {
	n := newNode(t)
	m := expected()
	m[12] = measurements.Measurement{Expected: bytes.Repeat([]byte{0xbb}, 32), WarnOnly: true}
	var logs bytes.Buffer
	if _, err := validator(t, n, m, &logs).Validate(context.Background(), issue(t, n), nonce); err != nil {
		t.Fatalf("warn-only mismatch rejected: %v", err)
	}
	if !strings.Contains(logs.String(), "warn-only PCR") || !strings.Contains(logs.String(), "pcr=12") {
		t.Fatalf("warn-only mismatch not logged; log: %s", logs.String())
	}
}

func TestReplayedAttestationRefused(t *testing.T) {
	n := newNode(t)
	doc := issue(t, n)
	fresh := bytes.Repeat([]byte{0x43}, 32)
	if _, err := validator(t, n, expected(), nil).Validate(context.Background(), doc, fresh); err == nil {
		t.Fatal("attestation for an old nonce accepted with a new nonce")
	}
}

func TestSwappedUserDataRefused(t *testing.T) {
	n := newNode(t)
	doc := mutateDoc(t, issue(t, n), func(d *vtpm.Document) { d.UserData = []byte("someone else's TLS key") })
	if _, err := validator(t, n, expected(), nil).Validate(context.Background(), doc, nonce); err == nil {
		t.Fatal("attestation with swapped user data accepted")
	}
}

func TestTamperedAttestationRefused(t *testing.T) {
	n := newNode(t)
	v := validator(t, n, expected(), nil)
	tests := map[string]func(*attestpb.Attestation){
		"quote body": func(a *attestpb.Attestation) {
			for _, q := range a.Quotes {
				q.Quote[len(q.Quote)-1] ^= 1
			}
		},
		"signature": func(a *attestpb.Attestation) {
			for _, q := range a.Quotes {
				q.RawSig[len(q.RawSig)-1] ^= 1
			}
		},
		"PCR value": func(a *attestpb.Attestation) {
			for _, q := range a.Quotes {
				q.Pcrs.Pcrs[11][0] ^= 1
			}
		},
		"no SHA-256 quote": func(a *attestpb.Attestation) {
			a.Quotes = a.Quotes[:0]
		},
		"AK certificate removed": func(a *attestpb.Attestation) { a.AkCert = nil },
	}
	for name, mutate := range tests {
		t.Run(name, func(t *testing.T) {
			doc := mutateAttestation(t, issue(t, n), mutate)
			if _, err := v.Validate(context.Background(), doc, nonce); err == nil {
				t.Fatal("tampered attestation accepted")
			}
		})
	}
}

func TestTamperedMeasurementLogRefused(t *testing.T) {
	n := newNode(t)
	v := validator(t, n, expected(), nil)
	doc := mutateDoc(t, issue(t, n), func(d *vtpm.Document) {
		d.MeasurementLog = bytes.Replace(d.MeasurementLog, []byte("initrd: enter-initrd"), []byte("something harmless"), 1)
	})
	// A changed description is not caught by replay (only digests are
	// extended), but a dropped entry is.
	if _, err := v.Validate(context.Background(), doc, nonce); err != nil {
		t.Fatalf("description change should still replay: %v", err)
	}
	// A log that claims another digest, or an extra extend, does not
	// replay to the quoted PCRs. (A missing or shortened log is refused
	// too; see TestIncompleteMeasurementLogRefused.)
	d := sha256.Sum256([]byte("enter-initrd"))
	other := sha256.Sum256([]byte("something else"))
	tests := map[string]func(*vtpm.Document){
		"changed digest": func(d2 *vtpm.Document) {
			d2.MeasurementLog = bytes.Replace(d2.MeasurementLog, []byte(hex.EncodeToString(d[:])), []byte(hex.EncodeToString(other[:])), 1)
		},
		"extra entry": func(d2 *vtpm.Document) {
			d2.MeasurementLog = append(d2.MeasurementLog, []byte(`{"pcr":13,"digests":{"sha256":"`+hex.EncodeToString(other[:])+`"},"description":"x"}`+"\n")...)
		},
	}
	for name, mutate := range tests {
		t.Run(name, func(t *testing.T) {
			_, err := v.Validate(context.Background(), mutateDoc(t, issue(t, n), mutate), nonce)
			if err == nil || !strings.Contains(err.Error(), "do not replay") {
				t.Fatalf("err = %v, want a replay error", err)
			}
		})
	}
}

func TestAKFromOtherCARefused(t *testing.T) {
	n := newNode(t)
	other, err := platformca.New("another cloud")
	if err != nil {
		t.Fatal(err)
	}
	v, err := qemu.NewValidator(qemu.ValidatorConfig{Measurements: expected(), PlatformCAs: []*x509.Certificate{other.Cert}})
	if err != nil {
		t.Fatal(err)
	}
	_, err = v.Validate(context.Background(), issue(t, n), nonce)
	if err == nil || !strings.Contains(err.Error(), "not signed by the platform CA") {
		t.Fatalf("err = %v, want a platform CA error", err)
	}
}

func TestUnprovisionedTPMCannotIssue(t *testing.T) {
	in := swtpmtest.Start(t)
	iss, err := qemu.NewIssuer(qemu.IssuerConfig{OpenTPM: in.Open})
	if err != nil {
		t.Fatal(err)
	}
	_, err = iss.Issue(context.Background(), userData, nonce)
	if err == nil || !strings.Contains(err.Error(), "provisioned") {
		t.Fatalf("err = %v, want a hint that the vTPM is not provisioned", err)
	}
}

func TestTrustAnyAKSaysSoLoudly(t *testing.T) {
	n := newNode(t)
	doc := mutateAttestation(t, issue(t, n), func(a *attestpb.Attestation) { a.AkCert = nil })
	var logs bytes.Buffer
	v, err := qemu.NewValidator(qemu.ValidatorConfig{
		Measurements: expected(),
		TrustAnyAK:   true,
		Logger:       slog.New(slog.NewTextHandler(&logs, nil)),
	})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := v.Validate(context.Background(), doc, nonce); err != nil {
		t.Fatalf("TrustAnyAK rejected an uncertified AK: %v", err)
	}
	if strings.Count(logs.String(), "INSECURE") < 2 {
		t.Fatalf("TrustAnyAK not logged at construction and use; log: %s", logs.String())
	}
}

func TestValidatorNeedsTrustAnchor(t *testing.T) {
	if _, err := qemu.NewValidator(qemu.ValidatorConfig{Measurements: expected()}); err == nil {
		t.Fatal("validator without platform CA and without TrustAnyAK was created")
	}
	if _, err := qemu.NewValidator(qemu.ValidatorConfig{TrustAnyAK: true}); err == nil {
		t.Fatal("validator without measurements was created")
	}
}

func TestGarbageDocumentsRefused(t *testing.T) {
	n := newNode(t)
	v := validator(t, n, expected(), nil)
	doc := issue(t, n)
	tests := map[string][]byte{
		"empty":          nil,
		"garbage":        []byte("\x00\xff garbage"),
		"truncated":      doc[:len(doc)/2],
		"JSON null":      []byte("null"),
		"no attestation": []byte(`{"userData":"AA=="}`),
		"bad proto":      []byte(`{"attestation":"/////w=="}`),
		"unknown field":  []byte(`{"attestation":"AA==","extra":1}`),
	}
	for name, raw := range tests {
		t.Run(name, func(t *testing.T) {
			if _, err := v.Validate(context.Background(), raw, nonce); err == nil {
				t.Fatal("accepted")
			}
		})
	}
}

// TestFirmwareEventLogReplay checks the firmware half of the replay with a
// TCG crypto-agile log built here, whose events are also extended into the
// TPM, as firmware would.
func TestFirmwareEventLogReplay(t *testing.T) {
	n := newNode(t)
	events := []fwEvent{
		{pcr: 4, typ: 0x80000003, data: []byte("EFI application: BOOTX64.EFI")},
		{pcr: 9, typ: 0x0000000d, data: []byte("initrd")},
		{pcr: 11, typ: 0x0000000d, data: []byte("UKI section .linux")},
	}
	withTPM(t, n.tpm, func(rw io.ReadWriter) {
		for _, e := range events {
			d := sha256.Sum256(e.data)
			if err := tpm2.PCRExtend(rw, tpmutil.Handle(e.pcr), tpm2.AlgSHA256, d[:], ""); err != nil {
				t.Fatal(err)
			}
		}
	})
	if err := os.WriteFile(n.fwLog, buildTCGLog(events), 0o644); err != nil {
		t.Fatal(err)
	}
	// newNode measured "enter-initrd" into PCR 11 before these firmware
	// events; replay applies the firmware log first, so the order is wrong
	// and PCR 11 must not replay.
	m := expected()
	delete(m, 11)
	m[4] = measurements.Measurement{Expected: replayOf(events, 4)}
	m[9] = measurements.Measurement{Expected: replayOf(events, 9)}
	v := validator(t, n, m, nil)
	_, err := v.Validate(context.Background(), issue(t, n), nonce)
	if err == nil || !strings.Contains(err.Error(), "PCR 11") {
		t.Fatalf("logs in the wrong order for PCR 11: err = %v, want a replay error on PCR 11", err)
	}

	// A node whose firmware measured first replays cleanly.
	n2 := newNodeWithFirmware(t, events)
	v2 := validator(t, n2, m, nil)
	if _, err := v2.Validate(context.Background(), issue(t, n2), nonce); err != nil {
		t.Fatalf("valid firmware log rejected: %v", err)
	}
	// A firmware log whose event digest was changed no longer replays.
	bad := append([]fwEvent(nil), events...)
	bad[0].data = []byte("EFI application: evil.efi")
	if err := os.WriteFile(n2.fwLog, buildTCGLog(bad), 0o644); err != nil {
		t.Fatal(err)
	}
	_, err = v2.Validate(context.Background(), issue(t, n2), nonce)
	if err == nil || !strings.Contains(err.Error(), "PCR 4") {
		t.Fatalf("tampered firmware log: err = %v, want a replay error on PCR 4", err)
	}
}

func newNodeWithFirmware(t *testing.T, events []fwEvent) *node {
	n := &node{tpm: swtpmtest.Start(t), log: &pcrlog.Log{Path: filepath.Join(t.TempDir(), "measurements.log")}}
	var err error
	if n.ca, err = platformca.New("test platform CA"); err != nil {
		t.Fatal(err)
	}
	withTPM(t, n.tpm, func(rw io.ReadWriter) {
		for _, e := range events {
			d := sha256.Sum256(e.data)
			if err := tpm2.PCRExtend(rw, tpmutil.Handle(e.pcr), tpm2.AlgSHA256, d[:], ""); err != nil {
				t.Fatal(err)
			}
		}
		if _, err := n.ca.ProvisionAK(rw, platformca.NewInstance("node-0")); err != nil {
			t.Fatal(err)
		}
		if err := n.log.Measure(rw, 11, []byte("enter-initrd"), "initrd: enter-initrd"); err != nil {
			t.Fatal(err)
		}
	})
	n.fwLog = filepath.Join(t.TempDir(), "binary_bios_measurements")
	if err := os.WriteFile(n.fwLog, buildTCGLog(events), 0o644); err != nil {
		t.Fatal(err)
	}
	n.issuer, err = qemu.NewIssuer(qemu.IssuerConfig{OpenTPM: n.tpm.Open, FirmwareEventLogPath: n.fwLog, MeasurementLog: n.log})
	if err != nil {
		t.Fatal(err)
	}
	return n
}

type fwEvent struct {
	pcr  uint32
	typ  uint32
	data []byte
}

func replayOf(events []fwEvent, pcr uint32) []byte {
	v := make([]byte, 32)
	for _, e := range events {
		if e.pcr != pcr {
			continue
		}
		d := sha256.Sum256(e.data)
		s := sha256.Sum256(append(v, d[:]...))
		v = s[:]
	}
	return v
}

// buildTCGLog encodes events as a TCG PC Client crypto-agile event log with
// a SHA-256 bank only (TCG PC Client Platform Firmware Profile, 10.2).
func buildTCGLog(events []fwEvent) []byte {
	le := binary.LittleEndian
	var b bytes.Buffer
	// Spec ID event in the legacy TCG_PCR_EVENT format.
	var spec bytes.Buffer
	spec.WriteString("Spec ID Event03\x00")
	binary.Write(&spec, le, uint32(0)) // platform class
	spec.Write([]byte{0, 2, 0, 2})     // version minor, major, errata, uintn size
	binary.Write(&spec, le, uint32(1)) // one algorithm
	binary.Write(&spec, le, uint16(0x000b))
	binary.Write(&spec, le, uint16(32))
	spec.WriteByte(0) // vendor info size
	binary.Write(&b, le, uint32(0))
	binary.Write(&b, le, uint32(3)) // EV_NO_ACTION
	b.Write(make([]byte, 20))
	binary.Write(&b, le, uint32(spec.Len()))
	b.Write(spec.Bytes())
	for _, e := range events {
		d := sha256.Sum256(e.data)
		binary.Write(&b, le, e.pcr)
		binary.Write(&b, le, e.typ)
		binary.Write(&b, le, uint32(1))
		binary.Write(&b, le, uint16(0x000b))
		b.Write(d[:])
		binary.Write(&b, le, uint32(len(e.data)))
		b.Write(e.data)
	}
	return b.Bytes()
}

func mutateDoc(t testing.TB, raw []byte, fn func(*vtpm.Document)) []byte {
	t.Helper()
	d, err := vtpm.ParseDocument(raw)
	if err != nil {
		t.Fatal(err)
	}
	fn(&d)
	out, err := json.Marshal(d)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func mutateAttestation(t testing.TB, raw []byte, fn func(*attestpb.Attestation)) []byte {
	t.Helper()
	return mutateDoc(t, raw, func(d *vtpm.Document) {
		var a attestpb.Attestation
		if err := proto.Unmarshal(d.Attestation, &a); err != nil {
			t.Fatal(err)
		}
		fn(&a)
		var err error
		if d.Attestation, err = proto.Marshal(&a); err != nil {
			t.Fatal(err)
		}
	})
}

func quoteGo(b []byte) string { return strconv.Quote(string(b)) }
