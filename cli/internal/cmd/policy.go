package cmd

import (
	"github.com/spf13/pflag"

	"github.com/orrery-dev/orrery/internal/attestation/policy"
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
	return policy.LoadWithTestRoot(path, testRootPath)
}
