package snp

import (
	"github.com/google/go-sev-guest/abi"
	spb "github.com/google/go-sev-guest/proto/sevsnp"
)

// QuoteProvider is a go-sev-guest quote provider whose reports come from
// a function rather than the kernel: on the local cloud's simulated
// SEV-SNP VMs, from the cloud's simulated AMD Secure Processor (through
// its metadata service); in tests, from a snpsim.Chip.
type QuoteProvider struct {
	// GetReport returns an extended report (the report, then its
	// certificate table) for reportData.
	GetReport func(reportData [abi.ReportDataSize]byte) ([]byte, error)
}

// IsSupported implements go-sev-guest's client.QuoteProvider.
func (QuoteProvider) IsSupported() bool { return true }

// GetRawQuote implements go-sev-guest's client.QuoteProvider.
func (p QuoteProvider) GetRawQuote(reportData [abi.ReportDataSize]byte) ([]byte, error) {
	return p.GetReport(reportData)
}

// Product implements go-sev-guest's client.QuoteProvider (deprecated
// there: version 3 reports name their product themselves).
func (QuoteProvider) Product() *spb.SevProduct {
	return &spb.SevProduct{Name: spb.SevProduct_SEV_PRODUCT_MILAN}
}
