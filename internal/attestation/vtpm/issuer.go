package vtpm

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"

	"github.com/google/go-tpm-tools/client"
	attestpb "github.com/google/go-tpm-tools/proto/attest"
	"google.golang.org/protobuf/proto"

	"github.com/orrery-dev/orrery/internal/attestation"
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
}

// Issuer issues vTPM attestation documents.
type Issuer struct {
	cfg IssuerConfig
}

// NewIssuer returns an issuer.
func NewIssuer(cfg IssuerConfig) (*Issuer, error) {
	if cfg.OpenTPM == nil || cfg.LoadAK == nil || cfg.Variant == (variant.Variant{}) {
		return nil, errors.New("vtpm issuer: Variant, OpenTPM and LoadAK are required")
	}
	return &Issuer{cfg: cfg}, nil
}

// Variant implements attestation.Issuer.
func (i *Issuer) Variant() variant.Variant { return i.cfg.Variant }

// Issue implements attestation.Issuer: it quotes every allocated PCR bank
// with the AK over BindingDigest(nonce, userData).
func (i *Issuer) Issue(ctx context.Context, userData, nonce []byte) ([]byte, error) {
	if len(nonce) == 0 {
		return nil, errors.New("attest: empty nonce")
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	firmwareLog, err := readOptional(i.cfg.FirmwareEventLogPath)
	if err != nil {
		return nil, fmt.Errorf("read firmware event log: %w", err)
	}

	rw, err := i.cfg.OpenTPM()
	if err != nil {
		return nil, fmt.Errorf("open TPM: %w", err)
	}
	defer rw.Close()
	ak, err := i.cfg.LoadAK(rw)
	if err != nil {
		return nil, fmt.Errorf("load attestation key: %w", err)
	}
	defer ak.Close()

	opts := client.AttestOpts{
		Nonce:              attestation.BindingDigest(nonce, userData),
		TCGEventLog:        firmwareLog,
		SkipTeeAttestation: true,
	}
	if i.cfg.OpenTEE != nil {
		dev, err := i.cfg.OpenTEE()
		if err != nil {
			return nil, fmt.Errorf("open the TEE attestation device: %w", err)
		}
		defer dev.Close()
		opts.TEEDevice, opts.TEENonce, opts.SkipTeeAttestation = dev, tee.ReportData(nonce, userData), false
	}

	var att *attestpb.Attestation
	quote := func() error {
		var err error
		att, err = ak.Attest(opts)
		if err != nil {
			return fmt.Errorf("quote PCRs: %w", err)
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

	raw, err := proto.Marshal(att)
	if err != nil {
		return nil, fmt.Errorf("encode attestation: %w", err)
	}
	return Document{Attestation: raw, UserData: userData, MeasurementLog: userLog}.Marshal()
}

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
