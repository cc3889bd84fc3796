package main

import (
	"fmt"
	"io"

	"github.com/google/go-tpm-tools/client"
	"github.com/google/go-tpm/legacy/tpm2"

	"github.com/orrery-dev/orrery/internal/tpm/tpmdev"
)

// printPCRs writes the SHA-256 PCR bank, one "PCR[n] sha256=<hex>" line per
// PCR, so the journal and the console of every boot show them.
func printPCRs(w io.Writer) error {
	rw, err := tpmdev.Open()
	if err != nil {
		return err
	}
	defer rw.Close()
	pcrs, err := client.ReadPCRs(rw, client.FullPcrSel(tpm2.AlgSHA256))
	if err != nil {
		return fmt.Errorf("read PCRs: %w", err)
	}
	for i := uint32(0); i < 24; i++ {
		fmt.Fprintf(w, "PCR[%d] sha256=%x\n", i, pcrs.GetPcrs()[i])
	}
	return nil
}
