package tdx

import (
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"

	tdxpb "github.com/google/go-tdx-guest/proto/tdx"
	"github.com/google/go-tdx-guest/validate"

	"github.com/orrery-dev/orrery/internal/attestation/tee"
)

// checkBase runs the checks every quote must pass whatever the policy,
// each through go-tdx-guest's validate on its own so that a failure says
// which: the bits of XFAM and TD attributes that no TD may have (checked
// by validate on every call, hence first and alone), the session's
// report data, and no debug.
func checkBase(q *tdxpb.QuoteV4, reportData []byte) error {
	if err := validate.TdxQuote(q, &validate.Options{}); err != nil {
		return fmt.Errorf("%w: %w", ErrQuoteFieldsRejected, err)
	}
	bound := &validate.Options{TdQuoteBodyOptions: validate.TdQuoteBodyOptions{ReportData: reportData}}
	if validate.TdxQuote(q, bound) != nil {
		return ErrNotBound
	}
	if binary.LittleEndian.Uint64(q.GetTdQuoteBody().GetTdAttributes())&tdAttributesDebug != 0 {
		return fmt.Errorf("TDX quote refused: %w", &tee.Mismatch{
			Field:  "tdAttributes.DEBUG",
			Seen:   "set",
			Wanted: "clear (the host can read and change a debug TD's memory: debug TDs are refused whatever the policy says)",
		})
	}
	return nil
}

// policyCheck is one field of the owner's policy, as go-tdx-guest's
// validate options with that field alone set.
type policyCheck struct {
	field        string
	warnOnly     bool
	opts         validate.Options
	seen, wanted string
}

// checkPolicy runs every check the policy sets. Since the base checks
// passed, a check that fails fails for its own field. Warn-only
// failures are logged; enforced ones are all returned, joined.
func (v *Verifier) checkPolicy(q *tdxpb.QuoteV4) error {
	var refused []error
	for _, c := range policyChecks(v.cfg.Policy, q) {
		if validate.TdxQuote(q, &c.opts) == nil {
			continue
		}
		if c.warnOnly {
			v.log.Warn("warn-only TDX policy check failed", "field", c.field, "seen", c.seen, "wanted", c.wanted)
			continue
		}
		refused = append(refused, fmt.Errorf("TDX quote refused: %w", &tee.Mismatch{Field: c.field, Seen: c.seen, Wanted: c.wanted}))
	}
	return errors.Join(refused...)
}

func policyChecks(p Policy, q *tdxpb.QuoteV4) []policyCheck {
	b := q.GetTdQuoteBody()
	exact := func(field string, e *tee.Expected, seen []byte, set func(*validate.TdQuoteBodyOptions)) policyCheck {
		c := policyCheck{field: field, warnOnly: e.WarnOnly, seen: hex.EncodeToString(seen), wanted: hex.EncodeToString(e.Expected)}
		set(&c.opts.TdQuoteBodyOptions)
		return c
	}
	var checks []policyCheck
	// Without a fixed MRTD, checkEndorsedLaunch has checked it.
	if e := p.MRTD; e != nil {
		checks = append(checks, exact("mrtd", e, b.GetMrTd(), func(o *validate.TdQuoteBodyOptions) { o.MrTd = e.Expected }))
	}
	for i, r := range p.RTMR {
		if r == nil {
			continue
		}
		var seen []byte // validate refuses a quote without four RTMRs
		if i < len(b.GetRtmrs()) {
			seen = b.GetRtmrs()[i]
		}
		checks = append(checks, exact(rtmrNames[i], r, seen, func(o *validate.TdQuoteBodyOptions) {
			// validate wants all four RTMRs; an empty one is not checked.
			o.Rtmrs = make([][]byte, len(p.RTMR))
			o.Rtmrs[i] = r.Expected
		}))
	}
	if e := p.MRSEAM; e != nil {
		checks = append(checks, exact("mrseam", e, b.GetMrSeam(), func(o *validate.TdQuoteBodyOptions) { o.MrSeam = e.Expected }))
	}
	if e := p.TDAttributes; e != nil {
		checks = append(checks, exact("tdAttributes", e, b.GetTdAttributes(), func(o *validate.TdQuoteBodyOptions) { o.TdAttributes = e.Expected }))
	}
	if m := p.MinimumTEETCBSVN; m != nil {
		c := policyCheck{field: "minimumTeeTcbSvn", warnOnly: m.WarnOnly, seen: hex.EncodeToString(b.GetTeeTcbSvn()),
			wanted: "at least " + hex.EncodeToString(m.Minimum) + " in every byte (an older TDX module or firmware has known vulnerabilities: the host must update)"}
		c.opts.TdQuoteBodyOptions.MinimumTeeTcbSvn = m.Minimum
		checks = append(checks, c)
	}
	if m := p.MinimumQESVN; m != nil {
		c := policyCheck{field: "minimumQeSvn", warnOnly: m.WarnOnly, seen: fmt.Sprint(qeSVN(q)),
			wanted: fmt.Sprintf("at least %d (the host must update its quoting enclave)", m.Minimum)}
		c.opts.HeaderOptions.MinimumQeSvn = uint16(m.Minimum) // Validate bounds it
		checks = append(checks, c)
	}
	return checks
}

// qeSVN is the header's QE_SVN, little endian as validate reads it.
func qeSVN(q *tdxpb.QuoteV4) uint16 {
	if b := q.GetHeader().GetQeSvn(); len(b) == 2 {
		return binary.LittleEndian.Uint16(b)
	}
	return 0
}

// fields are the quote's fields as `orrery verify` prints them.
func fields(q *tdxpb.QuoteV4, lv tcbLevels) []tee.Field {
	b := q.GetTdQuoteBody()
	out := []tee.Field{{Name: "MRTD", Value: hex.EncodeToString(b.GetMrTd())}}
	for i, r := range b.GetRtmrs() {
		out = append(out, tee.Field{Name: fmt.Sprintf("RTMR%d", i), Value: hex.EncodeToString(r)})
	}
	return append(out,
		tee.Field{Name: "MRSEAM", Value: hex.EncodeToString(b.GetMrSeam())},
		tee.Field{Name: "TD attributes", Value: attributesText(b.GetTdAttributes())},
		tee.Field{Name: "XFAM", Value: hex.EncodeToString(b.GetXfam())},
		tee.Field{Name: "TEE TCB SVN", Value: hex.EncodeToString(b.GetTeeTcbSvn())},
		tee.Field{Name: "TDX TCB status", Value: levelText(lv.tdx.TcbStatus, lv.tdx.TcbDate, lv.tdx.AdvisoryIDs)},
		tee.Field{Name: "QE SVN", Value: fmt.Sprint(qeSVN(q))},
		tee.Field{Name: "QE report ISV SVN", Value: fmt.Sprint(q.GetSignedData().GetCertificationData().GetQeReportCertificationData().GetQeReport().GetIsvSvn())},
		tee.Field{Name: "QE TCB status", Value: levelText(lv.qe.TcbStatus, lv.qe.TcbDate, lv.qe.AdvisoryIDs)},
	)
}

// tdAttributeNames are the TD attribute bits validate allows, by bit.
var tdAttributeNames = map[uint]string{0: "DEBUG", 28: "SEPT_VE_DISABLE", 30: "PKS", 63: "PERFMON"}

func attributesText(raw []byte) string {
	s := hex.EncodeToString(raw)
	if len(raw) != 8 {
		return s
	}
	a := binary.LittleEndian.Uint64(raw)
	var names []string
	for bit := range uint(64) {
		if a&(1<<bit) == 0 {
			continue
		}
		name, ok := tdAttributeNames[bit]
		if !ok {
			name = fmt.Sprintf("bit %d", bit)
		}
		names = append(names, name)
	}
	if len(names) == 0 {
		return s + " (none)"
	}
	return s + " (" + strings.Join(names, ", ") + ")"
}

func levelText[S ~string](status S, date string, advisories []string) string {
	if status == "" {
		return "not checked (verified without Intel's collateral)"
	}
	s := string(status) + ", TCB date " + date
	if len(advisories) > 0 {
		s += ", advisories " + strings.Join(advisories, " ")
	}
	return s
}
