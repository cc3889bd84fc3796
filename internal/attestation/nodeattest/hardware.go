package nodeattest

import (
	"encoding/pem"
	"fmt"

	"github.com/google/go-sev-guest/abi"
	sevclient "github.com/google/go-sev-guest/client"
)

// hardwareReport asks the kernel's SEV-SNP guest driver for an extended
// report.
func hardwareReport(data [abi.ReportDataSize]byte) ([]byte, error) {
	qp, err := sevclient.GetQuoteProvider()
	if err != nil {
		return nil, fmt.Errorf("open the SEV-SNP guest device: %w", err)
	}
	return qp.GetRawQuote(data)
}

func pemCert(der []byte) string {
	return string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}))
}
