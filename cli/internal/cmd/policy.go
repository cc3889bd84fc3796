package cmd

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"

	"github.com/spf13/pflag"

	"github.com/orrery-dev/orrery/internal/attestation/policy"
	"github.com/orrery-dev/orrery/internal/attestation/snp"
)

// snpTestRootHelp is the --snp-test-root flag's help, the same on every
// command that checks nodes.
const snpTestRootHelp = "accept SEV-SNP reports signed under this test root, a JSON file as 'orrery mini up --sev-snp' writes it (orrery-mini/" + snpTestRootFile + "): its reports come from the local cloud, not from any real CPU"

// snpTestRootFile is the file 'orrery mini up --sev-snp' writes the
// simulated chip's root into.
const snpTestRootFile = "snp-test-root.json"

func addSNPTestRootFlag(f *pflag.FlagSet, dst *string) {
	f.StringVar(dst, "snp-test-root", "", snpTestRootHelp)
}

// loadPolicy reads an image's measurements file and, if the owner named
// one, puts a test root into its SEV-SNP section in place of AMD's.
func loadPolicy(path, testRootPath string) (policy.Policy, error) {
	p, err := policy.Load(path)
	if err != nil {
		return policy.Policy{}, err
	}
	if testRootPath == "" {
		return p, nil
	}
	if p.SEVSNP == nil {
		return policy.Policy{}, fmt.Errorf("--snp-test-root names a root for SEV-SNP reports, but %s has no %q section, so nodes are not checked as SEV-SNP VMs: use the image's SEV-SNP measurements (build/image/measurements-sev-snp.json)", path, policy.SEVSNPKey)
	}
	root, err := readTestRoot(testRootPath)
	if err != nil {
		return policy.Policy{}, err
	}
	section := *p.SEVSNP
	section.TestRoot = &root
	p.SEVSNP = &section
	if err := p.Validate(); err != nil {
		return policy.Policy{}, fmt.Errorf("%s: %w", testRootPath, err)
	}
	return p, nil
}

func readTestRoot(path string) (snp.TestRoot, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return snp.TestRoot{}, fmt.Errorf("read the SEV-SNP test root: %w", err)
	}
	var root snp.TestRoot
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&root); err != nil {
		return snp.TestRoot{}, fmt.Errorf("SEV-SNP test root %s: %w", path, err)
	}
	if dec.More() {
		return snp.TestRoot{}, fmt.Errorf("SEV-SNP test root %s: trailing data", path)
	}
	if !root.NotARealCPU {
		return snp.TestRoot{}, errors.New(`the SEV-SNP test root in ` + path + ` does not say "notARealCpu": true`)
	}
	return root, nil
}
