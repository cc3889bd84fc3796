package qemu_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	attestpb "github.com/google/go-tpm-tools/proto/attest"
	tpmpb "github.com/google/go-tpm-tools/proto/tpm"
	"google.golang.org/protobuf/proto"

	"github.com/orrery-dev/orrery/internal/attestation/measurements"
	"github.com/orrery-dev/orrery/internal/attestation/qemu"
	"github.com/orrery-dev/orrery/internal/attestation/variant"
	"github.com/orrery-dev/orrery/internal/attestation/vtpm"
	"github.com/orrery-dev/orrery/internal/tpm/tpmdev"
)

// countingTPM records the command code of every command sent to a TPM.
type countingTPM struct {
	io.ReadWriteCloser
	codes *[]uint32
}

func (c countingTPM) Write(p []byte) (int, error) {
	// A TPM 2.0 command: tag (2 bytes), size (4), command code (4).
	if len(p) >= 10 {
		*c.codes = append(*c.codes, binary.BigEndian.Uint32(p[6:10]))
	}
	return c.ReadWriteCloser.Write(p)
}

func countingOpener(open tpmdev.Opener, codes *[]uint32) tpmdev.Opener {
	return func() (io.ReadWriteCloser, error) {
		rw, err := open()
		if err != nil {
			return nil, err
		}
		return countingTPM{ReadWriteCloser: rw, codes: codes}, nil
	}
}

const (
	ccQuote   = 0x158
	ccPCRRead = 0x17E
	ccNVRead  = 0x14E
)

// Under TCG every TPM command is a round trip through the guest's driver,
// QEMU and swtpm, and a handshake waits for all of them: an attestation
// quotes the one bank the validators read (swtpm allocates four), and
// sends no more commands than loading the AK, that quote and its PCR
// reads need.
func TestIssueQuotesOneBankWithFewCommands(t *testing.T) {
	n := newNode(t)
	var codes []uint32
	iss, err := qemu.NewIssuer(qemu.IssuerConfig{OpenTPM: countingOpener(n.tpm.Open, &codes), FirmwareEventLogPath: n.fwLog, MeasurementLog: n.log})
	if err != nil {
		t.Fatal(err)
	}
	// The first attestation reads the AK's template and certificate from
	// NV (and swtpm answers the first quote after it starts with
	// TPM_RC_RETRY, which go-tpm sends again); count a later one.
	if _, err := iss.Issue(context.Background(), userData, nonce); err != nil {
		t.Fatalf("Issue: %v", err)
	}
	codes = nil
	doc, err := iss.Issue(context.Background(), userData, nonce)
	if err != nil {
		t.Fatalf("Issue: %v", err)
	}
	if _, err := validator(t, n, expected(), nil).Validate(context.Background(), doc, nonce); err != nil {
		t.Fatalf("Validate: %v", err)
	}

	_, att := attestationOf(t, doc)
	if len(att.Quotes) != 1 || att.Quotes[0].GetPcrs().GetHash() != tpmpb.HashAlgo_SHA256 {
		t.Fatalf("quotes of banks %v, want the SHA-256 bank alone", banks(att))
	}
	if got := len(att.Quotes[0].GetPcrs().GetPcrs()); got != measurements.NumPCRs {
		t.Errorf("the quote carries %d PCR values, want all %d", got, measurements.NumPCRs)
	}
	count := map[uint32]int{}
	for _, c := range codes {
		count[c]++
	}
	if count[ccQuote] != 1 || count[ccPCRRead] != 3 {
		t.Errorf("%d quotes and %d PCR reads, want 1 and 3 (24 PCRs, 8 a read)", count[ccQuote], count[ccPCRRead])
	}
	if count[ccNVRead] != 0 {
		t.Errorf("a later attestation read NV %d times, want the AK's template and certificate kept", count[ccNVRead])
	}
	// Recreating the AK takes 1, the quote 4, the flush 1.
	if len(codes) > 6 {
		t.Errorf("one attestation sent %d TPM commands (%s), want at most 6", len(codes), hexCodes(codes))
	}
}

// An attestation slower than its limit is logged with the time each step
// took; a fast one is not logged at all.
func TestIssueLogsSlowSteps(t *testing.T) {
	n := newNode(t)
	for _, tc := range []struct {
		name string
		slow time.Duration
		want []string
	}{
		{"fast", time.Hour, nil},
		{"slow", time.Nanosecond, []string{"was slow", "open_tpm=", "load_ak=", "quote=", "total=", "variant=qemu-vtpm", "failed=false"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var logs bytes.Buffer
			iss, err := vtpm.NewIssuer(vtpm.IssuerConfig{
				Variant: variant.QEMUVTPM, OpenTPM: n.tpm.Open, LoadAK: qemu.LoadAK, MeasurementLog: n.log,
				Logger: slog.New(slog.NewTextHandler(&logs, nil)), SlowIssue: tc.slow,
			})
			if err != nil {
				t.Fatal(err)
			}
			if _, err := iss.Issue(context.Background(), userData, nonce); err != nil {
				t.Fatalf("Issue: %v", err)
			}
			got := logs.String()
			if tc.want == nil && got != "" {
				t.Fatalf("a fast attestation was logged:\n%s", got)
			}
			for _, w := range tc.want {
				if !strings.Contains(got, w) {
					t.Errorf("want %q in the log:\n%s", w, got)
				}
			}
			if strings.Contains(got, string(userData)) {
				t.Errorf("the log holds the attestation's user data:\n%s", got)
			}
		})
	}
}

// attestationOf decodes a document and the TPM attestation inside it.
func attestationOf(t *testing.T, doc []byte) (vtpm.Document, *attestpb.Attestation) {
	t.Helper()
	d, err := vtpm.ParseDocument(doc)
	if err != nil {
		t.Fatal(err)
	}
	var a attestpb.Attestation
	if err := proto.Unmarshal(d.Attestation, &a); err != nil {
		t.Fatal(err)
	}
	return d, &a
}

func banks(a *attestpb.Attestation) []string {
	var out []string
	for _, q := range a.Quotes {
		out = append(out, q.GetPcrs().GetHash().String())
	}
	return out
}

func hexCodes(codes []uint32) string {
	s := make([]string, len(codes))
	for i, c := range codes {
		s[i] = fmt.Sprintf("%#x", c)
	}
	return strings.Join(s, " ")
}
