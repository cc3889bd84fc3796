package pcrlog

import (
	"crypto"
	"fmt"
	"io"

	"github.com/google/go-tpm-tools/client"
	"github.com/google/go-tpm/legacy/tpm2"
	"github.com/google/go-tpm/tpmutil"
)

// Measure extends pcr in every allocated bank of the TPM with the hash of
// data in that bank's algorithm, and records the extend in the log. It is the
// only way Orrery's code extends a PCR.
func (l *Log) Measure(rw io.ReadWriter, pcr uint32, data []byte, description string) error {
	sels, err := client.AllocatedPCRs(rw)
	if err != nil {
		return fmt.Errorf("read allocated PCR banks: %w", err)
	}
	type bank struct {
		alg  tpm2.Algorithm
		hash crypto.Hash
	}
	var banks []bank
	var hashes []crypto.Hash
	for _, sel := range sels {
		if !contains(sel.PCRs, int(pcr)) {
			continue
		}
		h, err := sel.Hash.Hash()
		if err != nil || AlgorithmName(h) == "" {
			return fmt.Errorf("TPM has a PCR bank (algorithm %v) this log cannot record", sel.Hash)
		}
		banks = append(banks, bank{sel.Hash, h})
		hashes = append(hashes, h)
	}
	if len(banks) == 0 {
		return fmt.Errorf("PCR %d is not allocated in any bank of this TPM", pcr)
	}
	e := NewEntry(pcr, data, description, hashes...)
	return l.Record(e, func() error {
		for _, b := range banks {
			if err := tpm2.PCRExtend(rw, tpmutil.Handle(pcr), b.alg, e.Digest(b.hash), ""); err != nil {
				return fmt.Errorf("extend PCR %d (%s bank): %w", pcr, AlgorithmName(b.hash), err)
			}
		}
		return nil
	})
}

func contains(xs []int, x int) bool {
	for _, v := range xs {
		if v == x {
			return true
		}
	}
	return false
}
