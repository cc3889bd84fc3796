package cmd

import (
	"fmt"
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
	f.StringVar(&o.snpTestRoot, "snp-test-root", "", "accept SEV-SNP reports signed under this test root, a JSON file as 'orrery mini up --sev-snp' writes it (orrery-mini/"+snpTestRootFile+"): its reports come from the local cloud, not from any real CPU. Only this flag names a test root: none is read from the working directory or from a measurements file")
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
const secretMeasurementsUsage = "the image's measurements file; for simulated SEV-SNP VMs also name the local cloud's test root (--snp-test-root); a file that names its own test root is refused"

// measurementsUsage is the help of --measurements of the commands that
// only read nodes.
const measurementsUsage = "the image's measurements file (default: " + imageMeasurements + ", or " + imageSNPMeasuments +
	" for a cloud of 'orrery mini up --sev-snp', whose test root you name with --snp-test-root); a file that names its own test root is refused"

// withMiniDefaults picks the image 'make image' built when the owner named
// none: its SEV-SNP measurements for a local cloud of simulated SEV-SNP
// VMs (miniDir holds a test root). The test root itself is never taken
// unnamed: whoever can write a file in the working directory would
// otherwise replace AMD's roots. The owner who relies on the defaults is
// told to name it.
func withMiniDefaults(paths []string, o hardwareOptions, miniDir string) ([]string, error) {
	if len(paths) > 0 {
		return paths, nil
	}
	testRoot := filepath.Join(miniDir, snpTestRootFile)
	if _, err := os.Stat(testRoot); err != nil {
		return []string{imageMeasurements}, nil
	}
	if o.snpTestRoot == "" {
		return nil, fmt.Errorf("the local cloud in %s runs simulated SEV-SNP VMs, whose reports its test root signs, not a real CPU: "+
			"name that root with --snp-test-root %s to accept them, or name the image's measurements with --measurements", miniDir, testRoot)
	}
	return []string{imageSNPMeasuments}, nil
}

// loadPolicy reads an image's measurements file and, if the owner named
// one, puts a test root into its SEV-SNP section in place of AMD's.
func loadPolicy(path string, o hardwareOptions) (policy.Policy, error) {
	return policy.LoadWithTestRoot(path, o.snpTestRoot)
}
