package tdx

import (
	"bytes"
	"encoding/hex"
	"fmt"
	"strings"

	tdxpb "github.com/google/go-tdx-guest/proto/tdx"
)

// Intel's identities of its TD quoting enclave (QE) and of its TDX
// modules, as Intel's QE identity (id "TD_QE") and TDX TCB info
// ("tdxModule") state them. They come from Intel's signing keys and do
// not change with a TCB recovery (only the TCB levels around them do):
// TestIntelIdentitiesMatchCollateral checks them against Intel's files.
//
// A PCK certificate chained to Intel's root proves an Intel platform,
// not Intel's enclave: the platform's owner can launch an enclave of its
// own with the provisioning key and have the platform's provisioning
// enclave sign its report with the PCK key. That enclave could then sign
// any TD quote. Only the QE report's signer, product and attributes (a
// debug QE's memory is open to the host) tell Intel's QE from it.
var (
	intelQEMRSigner       = hexBytes("dc9e2a7c6f948f17474e34a7fc43ed030f7c1563f1babddf6340c82e0e54a8c5")
	intelQEProductID      = uint32(2)
	intelQEAttributes     = hexBytes("11000000000000000000000000000000")
	intelQEAttributesMask = hexBytes("fbffffffffffffff0000000000000000")
	intelQEMiscSelect     = uint32(0)
	intelQEMiscSelectMask = uint32(0xffffffff)
	// Intel's TDX modules have an all-zero MRSIGNERSEAM and SEAM
	// attributes (all bits compared).
	intelModuleMRSigner   = make([]byte, 48)
	intelModuleAttributes = make([]byte, 8)
)

func hexBytes(s string) []byte {
	b, err := hex.DecodeString(s)
	if err != nil {
		panic(err)
	}
	return b
}

// checkIntelIdentities refuses a quote whose QE report is not of Intel's
// TD quoting enclave (MRSIGNER, ISVPRODID, and MISCSELECT and ATTRIBUTES
// under Intel's masks) or whose TD report body names a TDX module Intel
// did not sign. go-tdx-guest checks the same against the collateral;
// without collateral this is done here, on the verified quote.
func checkIntelIdentities(q *tdxpb.QuoteV4) error {
	qe := q.GetSignedData().GetCertificationData().GetQeReportCertificationData().GetQeReport()
	body := q.GetTdQuoteBody()
	var bad []string
	if !bytes.Equal(qe.GetMrSigner(), intelQEMRSigner) {
		bad = append(bad, fmt.Sprintf("the QE's MRSIGNER is %x, Intel's is %x", qe.GetMrSigner(), intelQEMRSigner))
	}
	if qe.GetIsvProdId() != intelQEProductID {
		bad = append(bad, fmt.Sprintf("the QE's ISVPRODID is %d, Intel's TD QE's is %d", qe.GetIsvProdId(), intelQEProductID))
	}
	if qe.GetMiscSelect()&intelQEMiscSelectMask != intelQEMiscSelect {
		bad = append(bad, fmt.Sprintf("the QE's MISCSELECT is %#x, Intel's is %#x", qe.GetMiscSelect(), intelQEMiscSelect))
	}
	if attrs := qe.GetAttributes(); len(attrs) != len(intelQEAttributesMask) || !bytes.Equal(masked(attrs, intelQEAttributesMask), intelQEAttributes) {
		bad = append(bad, fmt.Sprintf("the QE's ATTRIBUTES are %x, Intel's are %x under the mask %x (a debug QE is refused)", attrs, intelQEAttributes, intelQEAttributesMask))
	}
	if !bytes.Equal(body.GetMrSignerSeam(), intelModuleMRSigner) {
		bad = append(bad, fmt.Sprintf("the TDX module's MRSIGNERSEAM is %x, Intel's modules' is zero", body.GetMrSignerSeam()))
	}
	if !bytes.Equal(body.GetSeamAttributes(), intelModuleAttributes) {
		bad = append(bad, fmt.Sprintf("the TDX module's SEAM attributes are %x, Intel's modules' are zero", body.GetSeamAttributes()))
	}
	if len(bad) > 0 {
		return fmt.Errorf("%w: %s", ErrNotIntelEnclave, strings.Join(bad, "; "))
	}
	return nil
}

func masked(b, mask []byte) []byte {
	out := make([]byte, len(b))
	for i := range b {
		out[i] = b[i] & mask[i]
	}
	return out
}
