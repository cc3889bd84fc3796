package tdx

import (
	"encoding/hex"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/google/go-tdx-guest/abi"
	tdxpb "github.com/google/go-tdx-guest/proto/tdx"

	"github.com/orrery-dev/orrery/internal/attestation/tee"
)

// realTime is inside the validity of every piece of the real evidence:
// the PCK certificate is valid from 2022-09-20, and the QE identity and
// PCK CRL expire on 2023-07-08 (TCB info on 2023-07-18). go-tdx-guest's
// own tests use the same instant.
var realTime = time.Date(2023, time.July, 1, 1, 0, 0, 0, time.UTC)

// The real quote's fields, read once from testdata/tdx_prod_quote_SPR_E4.dat
// (TestRealQuoteFields checks they still match the file).
const (
	realMRTD       = "6363b8043668a3ad953278e10389574d326c6749fb78aa810ecd9336923db86f22fc00b8dcd404bc10d5e119d7215cbb"
	realRTMR0      = "2927da70461cd63266f43230cc1849c03ef25ebe490062a801d8fcc80af42976823adf08f833c1e50b51779c6593f32a"
	realRTMR1      = "2c700b8ba9b85783f8be9fb9443647bdc0bb3c50747f06297cc6538c25a5f589c4b56d035c59107c6bc5800db2cacb61"
	realRTMR2      = "8652f0caaba7e215ea442dc36a4499d8fec3362f3a0b2ca151cbe4b3e6466fe59c7368b3c2287fc7c3bf5c924eb4424e"
	realRTMR3      = "000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000"
	realMRSEAM     = "2fd279c16164a93dd5bf373d834328d46008c2b693af9ebb865b08b2ced320c9a89b4869a9fab60fbe9d0c5a5363c656"
	realTDAttrs    = "0000004000000000" // PKS
	realTEETCBSVN  = "03000400000000000000000000000000"
	realReportData = "6c62dec1b8191749a31dab490be532a35944dea47caef1f980863993d9899545eb7406a38d1eed313b987a467dacead6f0c87a6d766c66f6f29f8acb281f1113"
)

// Byte offsets in the raw quote (Intel's TDX DCAP quote v4 layout): a
// 48-byte header, then the 584-byte TD report body, then the signed data.
const (
	offTDAttributes = 0x30 + 0x78
	offMRTD         = 0x30 + 0x88
	offReportData   = 0x30 + 0x208
	offSignature    = 0x30 + 0x248 + 4
	offQEReport     = offSignature + 64 + 64 + 6
)

func mustHex(t testing.TB, s string) []byte {
	t.Helper()
	b, err := hex.DecodeString(s)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func realQuoteRaw(t testing.TB) []byte {
	t.Helper()
	b, err := os.ReadFile("testdata/tdx_prod_quote_SPR_E4.dat")
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func parseQuote(t testing.TB, raw []byte) *tdxpb.QuoteV4 {
	t.Helper()
	q, err := abi.QuoteToProto(raw)
	if err != nil {
		t.Fatal(err)
	}
	return q.(*tdxpb.QuoteV4)
}

// realCollateral is the real Intel collateral of testdata/collateral, in
// memory so that a test can drop or change a file.
func realCollateral(t testing.TB) CollateralMap {
	t.Helper()
	names, err := filepath.Glob("testdata/collateral/*")
	if err != nil || len(names) == 0 {
		t.Fatalf("no collateral in testdata/collateral: %v", err)
	}
	m := CollateralMap{}
	for _, n := range names {
		b, err := os.ReadFile(n)
		if err != nil {
			t.Fatal(err)
		}
		m[filepath.Base(n)] = b
	}
	return m
}

// realPolicy enforces every field of the real quote.
func realPolicy(t testing.TB) Policy {
	exp := func(s string) *tee.Expected { return &tee.Expected{Expected: mustHex(t, s)} }
	return Policy{
		MRTD:             exp(realMRTD),
		RTMR:             [4]*tee.Expected{exp(realRTMR0), exp(realRTMR1), exp(realRTMR2), exp(realRTMR3)},
		MRSEAM:           exp(realMRSEAM),
		TDAttributes:     exp(realTDAttrs),
		MinimumTEETCBSVN: &MinimumSVN{Minimum: mustHex(t, realTEETCBSVN)},
		MinimumQESVN:     &tee.MinimumVersion{Minimum: 0},
	}
}

func textLogger(w io.Writer) *slog.Logger { return slog.New(slog.NewTextHandler(w, nil)) }

func fixedClock(at time.Time) func() time.Time { return func() time.Time { return at } }
