package snp

import (
	"encoding/hex"
	"fmt"
	"strings"

	"github.com/google/go-sev-guest/abi"
	"github.com/google/go-sev-guest/kds"
	spb "github.com/google/go-sev-guest/proto/sevsnp"
	"github.com/google/go-sev-guest/validate"

	"github.com/orrery-dev/orrery/internal/attestation/tee"
)

// policyCheck is one field of the owner's policy.
type policyCheck struct {
	field        string
	warnOnly     bool
	passes       func() bool
	seen, wanted string
}

// checkPolicy runs every check the policy sets. A field check is done by
// go-sev-guest's validate, with the base options plus that one field:
// since the base options passed, a failure is that field's.
func (v *Verifier) checkPolicy(att *spb.Attestation, base *validate.Options) error {
	with := func(set func(*validate.Options)) func() bool {
		return func() bool {
			o := *base
			set(&o)
			return validate.SnpAttestation(att, &o) == nil
		}
	}
	for _, c := range v.policyChecks(att.GetReport(), with) {
		if c.passes() {
			continue
		}
		m := &tee.Mismatch{Field: c.field, Seen: c.seen, Wanted: c.wanted}
		if !c.warnOnly {
			return fmt.Errorf("SEV-SNP report refused: %w", m)
		}
		v.log.Warn("warn-only SEV-SNP policy check failed", "field", c.field, "seen", c.seen, "wanted", c.wanted)
	}
	return nil
}

func (v *Verifier) policyChecks(report *spb.Report, with func(func(*validate.Options)) func() bool) []policyCheck {
	p := v.cfg.Policy
	var checks []policyCheck
	// Without a fixed measurement, checkEndorsedLaunch has checked it.
	if m := p.Measurement; m != nil {
		checks = append(checks, policyCheck{
			field:    "measurement",
			warnOnly: m.WarnOnly,
			passes:   with(func(o *validate.Options) { o.Measurement = m.Expected }),
			seen:     hex.EncodeToString(report.GetMeasurement()),
			wanted:   hex.EncodeToString(m.Expected),
		})
	}
	gp := p.GuestPolicy
	if gp == nil {
		gp = &GuestPolicy{AllowSMT: true}
	}
	{
		checks = append(checks, policyCheck{
			field:    "guest policy",
			warnOnly: gp.WarnOnly,
			passes: with(func(o *validate.Options) {
				o.GuestPolicy.SMT, o.GuestPolicy.MigrateMA = gp.AllowSMT, gp.AllowMigrationAgent
			}),
			seen:   policyText(report.GetPolicy()),
			wanted: fmt.Sprintf("at most SMT %s, migration agent %s", onOff(gp.AllowSMT), onOff(gp.AllowMigrationAgent)),
		})
	}
	if t := p.MinimumTCB; t != nil {
		checks = append(checks, policyCheck{
			field:    "reported TCB",
			warnOnly: t.WarnOnly,
			passes:   with(func(o *validate.Options) { o.MinimumTCB = t.parts() }),
			seen:     reportedTCB(report).String(),
			wanted:   "at least " + t.String() + " (an older TCB has known vulnerabilities: the host must update its AMD firmware)",
		})
	}
	if c := p.ChipIDs; c != nil && len(c.Allowed) > 0 {
		checks = append(checks, policyCheck{
			field:    "chip ID",
			warnOnly: c.WarnOnly,
			passes: func() bool {
				for _, id := range c.Allowed {
					if with(func(o *validate.Options) { o.ChipID = id })() {
						return true
					}
				}
				return false
			},
			seen:   hex.EncodeToString(report.GetChipId()),
			wanted: fmt.Sprintf("one of the %d allowed chips", len(c.Allowed)),
		})
	}
	if mv := p.MinimumReportVersion; mv != nil {
		checks = append(checks, policyCheck{
			field:    "report version",
			warnOnly: mv.WarnOnly,
			passes:   func() bool { return report.GetVersion() >= mv.Minimum },
			seen:     fmt.Sprint(report.GetVersion()),
			wanted:   fmt.Sprintf("at least %d", mv.Minimum),
		})
	}
	return checks
}

func reportedTCB(report *spb.Report) TCB {
	return tcbOf(kds.DecomposeTCBVersion(kds.TCBVersion(report.GetReportedTcb())))
}

func onOff(b bool) string {
	if b {
		return "allowed"
	}
	return "not allowed"
}

// policyText describes a report's guest policy through go-sev-guest's
// reading of it.
func policyText(raw uint64) string {
	p, err := abi.ParseSnpPolicy(raw)
	if err != nil {
		return fmt.Sprintf("%#x (malformed: %v)", raw, err)
	}
	return fmt.Sprintf("ABI %d.%d, debug %s, SMT %s, migration agent %s", p.ABIMajor, p.ABIMinor, onOff(p.Debug), onOff(p.SMT), onOff(p.MigrateMA))
}

// fields are the report's fields as `orrery verify` prints them.
func fields(att *spb.Attestation, root string, testRoot bool) []tee.Field {
	r := att.GetReport()
	signer := "VCEK"
	if info, err := abi.ParseSignerInfo(r.GetSignerInfo()); err == nil && info.SigningKey == abi.VlekReportSigner {
		signer = "VLEK"
	}
	out := []tee.Field{
		{Name: "report version", Value: fmt.Sprint(r.GetVersion())},
		{Name: "measurement", Value: hex.EncodeToString(r.GetMeasurement())},
		{Name: "guest policy", Value: policyText(r.GetPolicy())},
		{Name: "VMPL", Value: fmt.Sprint(r.GetVmpl())},
		{Name: "reported TCB", Value: reportedTCB(r).String()},
		{Name: "chip ID", Value: shortHex(r.GetChipId())},
		{Name: "host data", Value: hex.EncodeToString(r.GetHostData())},
		{Name: "signed by", Value: signer + " under " + root},
	}
	if testRoot {
		out = append(out, tee.Field{Name: "warning", Value: "this report was signed under a test root: it proves nothing about any CPU"})
	}
	return out
}

func shortHex(b []byte) string {
	s := hex.EncodeToString(b)
	if len(s) > 32 {
		return s[:32] + "…"
	}
	return strings.ToLower(s)
}
