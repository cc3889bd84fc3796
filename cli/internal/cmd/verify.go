package cmd

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/spf13/cobra"

	"github.com/orrery-dev/orrery/internal/attestation"
	"github.com/orrery-dev/orrery/internal/attestation/qemu/platformca"
	"github.com/orrery-dev/orrery/internal/owner"
	"github.com/orrery-dev/orrery/internal/owner/dialer"
	"github.com/orrery-dev/orrery/internal/proto/initpb"
)

type verifyOptions struct {
	node             string
	measurementsPath string
	hardware         hardwareOptions
	platformCAPath   string
	trustAnyAK       bool
	timeout          time.Duration
}

func newVerifyCmd() *cobra.Command {
	var o verifyOptions
	c := &cobra.Command{
		Use:   "verify --node HOST[:PORT] --measurements FILE --platform-ca FILE",
		Short: "Check a node's attestation against the image's expected measurements",
		Long: `verify connects to a node over attested TLS, has it quote its PCRs with its
vTPM, and checks the quote against the expected measurements of the image
(measurements.json from 'make image') and the attestation key against the
platform CA. It changes nothing on the node. It also prints the instance
(VM name and ID) the platform certified in the attestation key's
certificate: the ID is what 'orrery control-plane approve' takes.`,
		Example: `  orrery verify --node 10.42.1.100 \
    --measurements build/image/measurements.json \
    --platform-ca orrery-mini/platform-ca.crt`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return runVerify(cmd.Context(), cmd, o)
		},
	}
	f := c.Flags()
	f.StringVar(&o.node, "node", "", fmt.Sprintf("node address, HOST or HOST:PORT (port defaults to %d)", initpb.Port))
	f.StringVar(&o.measurementsPath, "measurements", "", "expected measurements, JSON or YAML")
	addHardwareFlags(f, &o.hardware)
	f.StringVar(&o.platformCAPath, "platform-ca", "", "PEM certificate of the CA that certifies the nodes' attestation keys")
	f.BoolVar(&o.trustAnyAK, "insecure-trust-any-ak", false, "accept any attestation key (development only: a software TPM can then impersonate a node)")
	f.DurationVar(&o.timeout, "timeout", time.Minute, "how long to wait for the node")
	_ = c.MarkFlagRequired("node")
	_ = c.MarkFlagRequired("measurements")
	return c
}

func runVerify(ctx context.Context, cmd *cobra.Command, o verifyOptions) error {
	m, err := loadPolicy(o.measurementsPath, o.hardware)
	if err != nil {
		return fmt.Errorf("load measurements: %w", err)
	}
	var cas []*x509.Certificate
	switch {
	case o.platformCAPath != "":
		ca, err := platformca.LoadCert(o.platformCAPath)
		if err != nil {
			return err
		}
		cas = append(cas, ca)
	case !o.trustAnyAK:
		return errors.New("no --platform-ca given: pass the platform CA certificate (for 'orrery mini': orrery-mini/platform-ca.crt), or --insecure-trust-any-ak for development")
	}
	addr := dialer.Address(o.node, initpb.Port)
	ctx, cancel := context.WithTimeout(ctx, o.timeout)
	defer cancel()
	res, err := owner.Verify(ctx, owner.VerifyConfig{
		Node: addr, Measurements: m, PlatformCAs: cas, Collateral: o.hardware.collateral(), TrustAnyAK: o.trustAnyAK,
		Logger: logger(cmd),
	})
	if err != nil {
		return err
	}
	fmt.Fprintf(cmd.OutOrStdout(), "OK: %s attested as %s; its PCRs match %s\n", addr, res.Variant, o.measurementsPath)
	// What an owner needs to approve the VM as a control plane
	// ('orrery control-plane approve'): only a certified instance, read
	// from an AK certificate that chained to the platform CA.
	if !res.Instance.IsZero() {
		fmt.Fprintf(cmd.OutOrStdout(), "Its platform certifies it as instance %q with instance ID %s\n", res.Instance.Name, res.Instance.ID)
	}
	writeHardware(cmd.OutOrStdout(), res.Hardware)
	return nil
}

// writeHardware prints a verified hardware report's fields, aligned.
func writeHardware(w io.Writer, fields []attestation.Field) {
	if len(fields) == 0 {
		return
	}
	fmt.Fprintln(w, "Its hardware report (verified):")
	width := 0
	for _, f := range fields {
		width = max(width, len(f.Name)+1)
	}
	for _, f := range fields {
		fmt.Fprintf(w, "  %-*s  %s\n", width, f.Name+":", f.Value)
	}
}
