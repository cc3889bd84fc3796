package cmd

import (
	"github.com/spf13/pflag"

	"github.com/orrery-dev/orrery/internal/attestation/policy"
	"github.com/orrery-dev/orrery/internal/attestation/validator"
)

// snpTestRootFile is the file 'orrery mini up --sev-snp' writes the
// simulated chip's root into.
const snpTestRootFile = "snp-test-root.json"

// hardwareOptions are the flags, the same on every command that checks
// nodes, that say what a node's hardware report is checked against
// besides the measurements file's section.
type hardwareOptions struct {
	snpTestRoot   string
	snpCollateral string
	tdxCollateral string
}

// addHardwareFlags adds the flags of a command that checks nodes.
func addHardwareFlags(f *pflag.FlagSet, o *hardwareOptions) {
	addSNPTestRootFlag(f, o)
	f.StringVar(&o.snpCollateral, "snp-collateral", "", "directory of AMD KDS collateral (product CRLs, certificates) for SEV-SNP reports under AMD's roots, laid out as KDS's URLs (kdsintf.amd.com/vcek/v1/Milan/crl); verification uses no network")
	f.StringVar(&o.tdxCollateral, "tdx-collateral", "", "directory of Intel PCS collateral (TCB info, QE identity, CRLs) for TD quotes; verification uses no network")
}

// addSNPTestRootFlag adds the flag that names a test root, alone for a
// command that only reads measurements files.
func addSNPTestRootFlag(f *pflag.FlagSet, o *hardwareOptions) {
	f.StringVar(&o.snpTestRoot, "snp-test-root", "", "accept SEV-SNP reports signed under this test root, a JSON file as 'orrery mini up --sev-snp' writes it (orrery-mini/"+snpTestRootFile+"): its reports come from the local cloud, not from any real CPU")
}

// collateral is the owner's collateral caches the flags name.
func (o hardwareOptions) collateral() validator.Collateral {
	return validator.Dirs(o.snpCollateral, o.tdxCollateral)
}

// loadPolicy reads an image's measurements file and, if the owner named
// one, puts a test root into its SEV-SNP section in place of AMD's.
func loadPolicy(path string, o hardwareOptions) (policy.Policy, error) {
	return policy.LoadWithTestRoot(path, o.snpTestRoot)
}
