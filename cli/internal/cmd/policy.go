package cmd

import (
	"os"
	"path/filepath"

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

// Measurements files 'make image' writes.
const (
	imageMeasurements  = "build/image/measurements.json"
	imageSNPMeasuments = "build/image/measurements-sev-snp.json"
)

// secretMeasurementsUsage is the help of --measurements of the commands
// that hand a node secrets (init, recover): they take no test root the
// owner did not name, since the local cloud writes it.
const secretMeasurementsUsage = "the image's measurements file; for simulated SEV-SNP VMs also name the local cloud's test root (--snp-test-root)"

// measurementsUsage is the help of --measurements of the commands that
// only read nodes.
const measurementsUsage = "the image's measurements file (default: " + imageMeasurements + ", or " + imageSNPMeasuments +
	" with the local cloud's test root for a cloud of 'orrery mini up --sev-snp')"

// withMiniDefaults fills in what the owner did not name: the image 'make
// image' built, and for a local cloud of simulated SEV-SNP VMs (miniDir
// holds a test root) that image's SEV-SNP measurements and the root.
func withMiniDefaults(paths []string, o hardwareOptions, miniDir string) ([]string, hardwareOptions) {
	testRoot := filepath.Join(miniDir, snpTestRootFile)
	_, err := os.Stat(testRoot)
	snp := err == nil
	if len(paths) == 0 {
		paths = []string{imageMeasurements}
		if snp {
			paths = []string{imageSNPMeasuments}
		}
	}
	if o.snpTestRoot == "" && snp {
		o.snpTestRoot = testRoot
	}
	return paths, o
}

// loadPolicy reads an image's measurements file and, if the owner named
// one, puts a test root into its SEV-SNP section in place of AMD's.
func loadPolicy(path string, o hardwareOptions) (policy.Policy, error) {
	return policy.LoadWithTestRoot(path, o.snpTestRoot)
}
