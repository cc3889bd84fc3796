package nodeattest

import (
	"encoding/pem"
	"fmt"

	"github.com/google/go-sev-guest/abi"
	sevclient "github.com/google/go-sev-guest/client"
	tdxclient "github.com/google/go-tdx-guest/client"
	tdxabi "github.com/google/go-tdx-guest/client/linuxabi"

	"github.com/orrery-dev/orrery/internal/attestation/tdx"
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

// hardwareTDReport asks the kernel's TDX guest driver, through
// go-tdx-guest's device, for this TD's TD report (TDG.MR.REPORT, ioctl
// TDX_CMD_GET_REPORT0). The TDX module writes it into the TD's own
// memory, out of the host's reach. A TD quote would not do as a node's
// word on itself: the host's quoting service makes it, and could hand
// back a genuine quote of another TD.
func hardwareTDReport(data [tdxabi.TdReportDataSize]byte) ([]byte, error) {
	d, err := tdxclient.OpenDevice()
	if err != nil {
		return nil, fmt.Errorf("open the TDX guest device: %w", err)
	}
	defer d.Close()
	req := tdxabi.TdxReportReq{ReportData: data}
	result, err := d.Ioctl(tdxabi.IocTdxGetReport, &req)
	if err != nil {
		return nil, fmt.Errorf("ask the TDX guest device for a TD report: %w", err)
	}
	if result != uintptr(tdxabi.TdxAttestSuccess) {
		return nil, fmt.Errorf("ask the TDX guest device for a TD report: it answered %d", result)
	}
	return req.TdReport[:], nil
}

// Places in a TDREPORT_STRUCT (Intel's TDX module ABI), which
// go-tdx-guest does not parse: REPORTMACSTRUCT (256 bytes, REPORTTYPE
// first), TEE_TCB_INFO (239) and 17 reserved bytes, then TDINFO_STRUCT
// at 512: ATTRIBUTES and XFAM (8 bytes each), MRTD, MRCONFIGID, MROWNER,
// MROWNERCONFIG, RTMR0 to RTMR3 (48 bytes each), ...
const (
	tdReportSize      = 1024
	tdReportTypeTDX   = 0x81 // REPORTTYPE.TYPE of a TD report
	tdMRTDOffset      = 512 + 16
	tdRTMR0Offset     = tdMRTDOffset + 4*tdMeasurementSize
	tdMeasurementSize = 48
)

// tdReportMeasurements reads MRTD and the RTMRs from a TD report.
func tdReportMeasurements(raw []byte) (tdx.Measurements, error) {
	if len(raw) != tdReportSize || raw[0] != tdReportTypeTDX {
		return tdx.Measurements{}, fmt.Errorf("the TDX guest device returned %d bytes that are not a TD report (%d bytes, type %#x)", len(raw), tdReportSize, tdReportTypeTDX)
	}
	field := func(off int) []byte { return append([]byte(nil), raw[off:off+tdMeasurementSize]...) }
	m := tdx.Measurements{MRTD: field(tdMRTDOffset)}
	for i := range m.RTMR {
		m.RTMR[i] = field(tdRTMR0Offset + i*tdMeasurementSize)
	}
	return m, nil
}
