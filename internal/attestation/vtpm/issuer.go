package vtpm

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"time"

	"github.com/google/go-tpm-tools/client"
	attestpb "github.com/google/go-tpm-tools/proto/attest"
	tpmpb "github.com/google/go-tpm-tools/proto/tpm"
	"github.com/google/go-tpm/legacy/tpm2"
	"google.golang.org/protobuf/proto"

	"github.com/orrery-dev/orrery/internal/attestation"
	"github.com/orrery-dev/orrery/internal/attestation/measurements"
	"github.com/orrery-dev/orrery/internal/attestation/tee"
	"github.com/orrery-dev/orrery/internal/attestation/variant"
	"github.com/orrery-dev/orrery/internal/tpm/pcrlog"
	"github.com/orrery-dev/orrery/internal/tpm/tpmdev"
)

// DefaultFirmwareEventLogPath is where Linux publishes the firmware's event log.
const DefaultFirmwareEventLogPath = "/sys/kernel/security/tpm0/binary_bios_measurements"

// IssuerConfig configures an Issuer.
type IssuerConfig struct {
	// Variant is reported to peers. Required.
	Variant variant.Variant
	// OpenTPM opens the TPM for one attestation; the issuer closes it.
	// Required.
	OpenTPM tpmdev.Opener
	// LoadAK loads the attestation key; the issuer closes it. Required.
	LoadAK func(rw io.ReadWriter) (*client.Key, error)
	// FirmwareEventLogPath is the firmware's TCG event log. Empty, or a
	// file that does not exist, means the attestation carries no firmware
	// log (as with a TPM that no firmware measured into).
	FirmwareEventLogPath string
	// MeasurementLog is the userspace measurement log. Nil means none.
	MeasurementLog *pcrlog.Log
	// OpenTEE opens the machine's TEE attestation device (an SEV-SNP
	// quote provider, a TDX one), whose report is attached beside the
	// quote with tee.ReportData of the same nonce and user data. Nil
	// means the variant attaches none.
	OpenTEE func() (client.TEEDevice, error)
	// Logger is told of an attestation that took longer than SlowIssue,
	// with the time each of its steps took. Nil discards.
	Logger *slog.Logger
	// SlowIssue is how long an attestation may take before it is logged.
	// Zero means DefaultSlowIssue.
	SlowIssue time.Duration
}

// DefaultSlowIssue is how long an attestation may take before the issuer
// logs its steps. Under TCG one takes a second or two; one past this is
// what makes a peer's attested handshake time out, and the log is the only
// place that tells which step (the vTPM, the hardware report) took the time.
const DefaultSlowIssue = 10 * time.Second

// Issuer issues vTPM attestation documents.
type Issuer struct {
	cfg IssuerConfig
}

// NewIssuer returns an issuer.
func NewIssuer(cfg IssuerConfig) (*Issuer, error) {
	if cfg.OpenTPM == nil || cfg.LoadAK == nil || cfg.Variant == (variant.Variant{}) {
		return nil, errors.New("vtpm issuer: Variant, OpenTPM and LoadAK are required")
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.SlowIssue == 0 {
		cfg.SlowIssue = DefaultSlowIssue
	}
	return &Issuer{cfg: cfg}, nil
}

// Variant implements attestation.Issuer.
func (i *Issuer) Variant() variant.Variant { return i.cfg.Variant }

// Issue implements attestation.Issuer: it quotes the SHA-256 PCR bank with
// the AK over BindingDigest(nonce, userData), and attaches the hardware
// report (if the variant has one) over tee.ReportData(nonce, userData).
func (i *Issuer) Issue(ctx context.Context, userData, nonce []byte) (_ []byte, err error) {
	if len(nonce) == 0 {
		return nil, errors.New("attest: empty nonce")
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	steps := newStepTimer()
	defer func() {
		if total := steps.total(); total > i.cfg.SlowIssue {
			i.cfg.Logger.Warn("this node's attestation for a handshake was slow",
				append(steps.took, "variant", i.cfg.Variant.String(), "total", round(total), "failed", err != nil)...)
		}
	}()
	firmwareLog, err := readOptional(i.cfg.FirmwareEventLogPath)
	if err != nil {
		return nil, fmt.Errorf("read firmware event log: %w", err)
	}

	rw, err := i.cfg.OpenTPM()
	if err != nil {
		return nil, fmt.Errorf("open TPM: %w", err)
	}
	defer rw.Close()
	steps.done("open_tpm")
	ak, err := i.cfg.LoadAK(rw)
	if err != nil {
		return nil, fmt.Errorf("load attestation key: %w", err)
	}
	defer ak.Close()
	steps.done("load_ak")

	digest := attestation.BindingDigest(nonce, userData)
	var q *tpmpb.Quote
	quote := func() error {
		var err error
		if q, err = ak.Quote(sha256Bank, digest); err != nil {
			return fmt.Errorf("quote the SHA-256 PCR bank: %w", err)
		}
		return nil
	}
	var userLog []byte
	if i.cfg.MeasurementLog != nil {
		// Quote and read the log under the log's lock, so no extend can
		// slip in between and make them disagree.
		userLog, err = i.cfg.MeasurementLog.Snapshot(quote)
	} else {
		err = quote()
	}
	if err != nil {
		return nil, err
	}
	steps.done("quote")
	akPub, err := ak.PublicArea().Encode()
	if err != nil {
		return nil, fmt.Errorf("encode the attestation key: %w", err)
	}
	att := &attestpb.Attestation{AkPub: akPub, AkCert: ak.CertDERBytes(), Quotes: []*tpmpb.Quote{q}, EventLog: firmwareLog}

	if i.cfg.OpenTEE != nil {
		if err := i.addHardwareReport(att, tee.ReportData(nonce, userData)); err != nil {
			return nil, err
		}
		steps.done("hardware_report")
	}

	raw, err := proto.Marshal(att)
	if err != nil {
		return nil, fmt.Errorf("encode attestation: %w", err)
	}
	return Document{Attestation: raw, UserData: userData, MeasurementLog: userLog}.Marshal()
}

// sha256Bank is what a node quotes: every PCR of the SHA-256 bank, the only
// bank the validators read. go-tpm-tools' Key.Attest quotes every allocated
// bank; swtpm allocates four, and each costs a quote and three PCR reads,
// every one a round trip through the guest's TPM driver, QEMU and swtpm.
var sha256Bank = tpm2.PCRSelection{Hash: tpm2.AlgSHA256, PCRs: func() []int {
	all := make([]int, measurements.NumPCRs)
	for n := range all {
		all[n] = n
	}
	return all
}()}

func (i *Issuer) addHardwareReport(att *attestpb.Attestation, reportData []byte) error {
	dev, err := i.cfg.OpenTEE()
	if err != nil {
		return fmt.Errorf("open the TEE attestation device: %w", err)
	}
	defer dev.Close()
	if err := dev.AddAttestation(att, client.AttestOpts{TEENonce: reportData}); err != nil {
		return fmt.Errorf("collect the TEE attestation report: %w", err)
	}
	return nil
}

// stepTimer records how long each step of one attestation took, as log
// attributes.
type stepTimer struct {
	start, last time.Time
	took        []any
}

func newStepTimer() *stepTimer {
	now := time.Now()
	return &stepTimer{start: now, last: now}
}

func (s *stepTimer) done(step string) {
	now := time.Now()
	s.took = append(s.took, step, round(now.Sub(s.last)))
	s.last = now
}

func (s *stepTimer) total() time.Duration { return time.Since(s.start) }

func round(d time.Duration) string { return d.Round(time.Millisecond).String() }

// readOptional reads path; an empty path or a missing file yields an empty,
// non-nil slice (go-tpm-tools reads the host's log itself when given nil).
func readOptional(path string) ([]byte, error) {
	if path == "" {
		return []byte{}, nil
	}
	b, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return []byte{}, nil
	}
	return b, err
}
