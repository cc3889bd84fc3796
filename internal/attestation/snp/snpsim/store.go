package snpsim

import (
	"crypto/ecdsa"
	"crypto/rsa"
	"crypto/x509"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/google/go-sev-guest/abi"
	"github.com/google/go-sev-guest/kds"
	test "github.com/google/go-sev-guest/testing"

	"github.com/orrery-dev/orrery/internal/atomicfile"
)

// stored is a chip on disk: its keys and certificates, so that a local
// cloud keeps one chip (and one root for the owner to name) across runs.
type stored struct {
	ChipID string `json:"chipId"`
	TCB    struct {
		Bootloader, TEE, SNP, Microcode uint8
	} `json:"tcb"`
	ARKKey  []byte `json:"arkKey"`
	ASKKey  []byte `json:"askKey"`
	VCEKKey []byte `json:"vcekKey"`
	ARK     []byte `json:"ark"`
	ASK     []byte `json:"ask"`
	VCEK    []byte `json:"vcek"`
}

// File is the name of a saved chip in its directory. It holds private
// keys: written 0600.
const File = "snp-chip.json"

// Save writes the chip into dir.
func (c *Chip) Save(dir string) error {
	var s stored
	s.ChipID = hex.EncodeToString(c.chipID[:])
	parts := kds.DecomposeTCBVersion(c.tcb)
	s.TCB.Bootloader, s.TCB.TEE, s.TCB.SNP, s.TCB.Microcode = parts.BlSpl, parts.TeeSpl, parts.SnpSpl, parts.UcodeSpl
	var err error
	if s.ARKKey, err = x509.MarshalPKCS8PrivateKey(c.signer.Keys.Ark); err != nil {
		return err
	}
	if s.ASKKey, err = x509.MarshalPKCS8PrivateKey(c.signer.Keys.Ask); err != nil {
		return err
	}
	if s.VCEKKey, err = x509.MarshalPKCS8PrivateKey(c.signer.Keys.Vcek); err != nil {
		return err
	}
	s.ARK, s.ASK, s.VCEK = c.signer.Ark.Raw, c.signer.Ask.Raw, c.signer.Vcek.Raw
	raw, err := json.Marshal(s)
	if err != nil {
		return err
	}
	return atomicfile.WriteFile(filepath.Join(dir, File), raw, 0o600)
}

// Load reads a chip Save wrote into dir; an error wrapping
// os.ErrNotExist if there is none.
func Load(dir string) (*Chip, error) {
	raw, err := os.ReadFile(filepath.Join(dir, File))
	if err != nil {
		return nil, err
	}
	var s stored
	if err := json.Unmarshal(raw, &s); err != nil {
		return nil, fmt.Errorf("%s: %w", File, err)
	}
	c, err := s.chip()
	if err != nil {
		return nil, fmt.Errorf("%s: %w (delete it to make a new chip)", filepath.Join(dir, File), err)
	}
	return c, nil
}

func (s stored) chip() (*Chip, error) {
	id, err := hex.DecodeString(s.ChipID)
	if err != nil || len(id) != abi.ChipIDSize {
		return nil, errors.New("malformed chip ID")
	}
	tcb, err := kds.ComposeTCBParts(kds.TCBParts{BlSpl: s.TCB.Bootloader, TeeSpl: s.TCB.TEE, SnpSpl: s.TCB.SNP, UcodeSpl: s.TCB.Microcode})
	if err != nil {
		return nil, err
	}
	keys := &test.AmdKeys{}
	var ok bool
	for _, k := range []struct {
		der []byte
		set func(any) bool
	}{
		{s.ARKKey, func(k any) bool { keys.Ark, ok = k.(*rsa.PrivateKey); return ok }},
		{s.ASKKey, func(k any) bool { keys.Ask, ok = k.(*rsa.PrivateKey); return ok }},
		{s.VCEKKey, func(k any) bool { keys.Vcek, ok = k.(*ecdsa.PrivateKey); return ok }},
	} {
		key, err := x509.ParsePKCS8PrivateKey(k.der)
		if err != nil || !k.set(key) {
			return nil, errors.New("malformed key")
		}
	}
	signer := &test.AmdSigner{Keys: keys}
	for _, c := range []struct {
		der []byte
		dst **x509.Certificate
	}{{s.ARK, &signer.Ark}, {s.ASK, &signer.Ask}, {s.VCEK, &signer.Vcek}} {
		if *c.dst, err = x509.ParseCertificate(c.der); err != nil {
			return nil, err
		}
	}
	chip := &Chip{signer: signer, tcb: tcb}
	copy(chip.chipID[:], id)
	return chip, nil
}

// WriteTestRoot writes the chip's root, with its CRL, as the JSON file
// an owner names with --snp-test-root.
func (c *Chip) WriteTestRoot(path string, now time.Time) error {
	root, err := c.TestRootWithCRL(now)
	if err != nil {
		return err
	}
	raw, err := json.MarshalIndent(root, "", "  ")
	if err != nil {
		return err
	}
	return atomicfile.WriteFile(path, append(raw, '\n'), 0o644)
}
