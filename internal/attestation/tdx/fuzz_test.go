package tdx

import (
	"context"
	"encoding/json"
	"encoding/pem"
	"reflect"
	"testing"

	tdxpb "github.com/google/go-tdx-guest/proto/tdx"
	"github.com/google/go-tdx-guest/verify"
	"google.golang.org/protobuf/proto"

	"github.com/orrery-dev/orrery/internal/attestation/tdx/tdxtest"
)

// FuzzParsePolicy feeds the strict decoder arbitrary input (seeds in
// testdata/fuzz/FuzzParsePolicy). What it accepts must write back and
// read back unchanged.
func FuzzParsePolicy(f *testing.F) {
	f.Fuzz(func(t *testing.T, data []byte) {
		p, err := ParsePolicy(data)
		if err != nil {
			return
		}
		out, err := json.Marshal(p)
		if err != nil {
			t.Fatalf("Marshal(accepted policy) = %v", err)
		}
		again, err := ParsePolicy(out)
		if err != nil {
			t.Fatalf("ParsePolicy(%s) = %v", out, err)
		}
		if !reflect.DeepEqual(p, again) {
			t.Fatalf("round trip changed the policy: %+v, then %+v", p, again)
		}
	})
}

// FuzzVerifyQuote parses arbitrary bytes as a quote with go-tdx-guest
// (through ParseQuote) and verifies what parses against the real
// collateral (seeds in testdata/fuzz/FuzzVerifyQuote: the real quote and
// variants). It must never panic, and never accept: the real platform's
// TCB is refused, and nothing else can be signed by Intel. The seed
// signed-data-size-too-small made go-tdx-guest's parser panic.
func FuzzVerifyQuote(f *testing.F) {
	v, err := NewVerifier(Config{Policy: realPolicy(f), Collateral: realCollateral(f), Now: fixedClock(realTime)})
	if err != nil {
		f.Fatal(err)
	}
	rd := mustHex(f, realReportData)
	f.Fuzz(func(t *testing.T, raw []byte) {
		q, err := ParseQuote(raw)
		if err != nil {
			return
		}
		if _, err := v.VerifyQuote(context.Background(), q, rd); err == nil {
			t.Fatal("VerifyQuote accepted a quote that Intel's collateral refuses")
		}
	})
}

// FuzzVerifyQuotePCKCert puts arbitrary bytes in the real quote as the
// DER of its PCK certificate (seeds in testdata/fuzz/FuzzVerifyQuotePCKCert:
// the real one). go-tdx-guest parses that certificate and its SGX
// extension before it has verified anything, so this is what an attacker
// reaches with a quote that is otherwise well formed.
func FuzzVerifyQuotePCKCert(f *testing.F) {
	v, err := NewVerifier(Config{Policy: realPolicy(f), Collateral: realCollateral(f), Now: fixedClock(realTime)})
	if err != nil {
		f.Fatal(err)
	}
	rd := mustHex(f, realReportData)
	base := parseQuote(f, realQuoteRaw(f))
	chain, err := verify.ExtractChainFromQuote(base)
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, der []byte) {
		q := proto.Clone(base).(*tdxpb.QuoteV4)
		data := q.GetSignedData().GetCertificationData().GetQeReportCertificationData().GetPckCertificateChainData()
		data.PckCertChain = append(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), tdxtest.PEMChain(chain.IntermediateCertificate, chain.RootCertificate)...)
		data.Size = uint32(len(data.PckCertChain))
		if _, err := v.VerifyQuote(context.Background(), q, rd); err == nil {
			t.Fatal("VerifyQuote accepted a quote that Intel's collateral refuses")
		}
	})
}
