package nodeattest

import (
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
)

// What the kernel itself found at boot, read where it tells userspace.
// The host cannot hide either one on real hardware: the kernel learns of
// SEV-SNP from the SEV_STATUS MSR, which an SEV-ES or SEV-SNP guest reads
// without the hypervisor, and of TDX from a TDCALL that only the TDX
// module answers. A host that claims either on a VM without it gets a
// guest that dies early in boot (PVALIDATE or TDCALL fault), not one
// that is misled.
var (
	// sevSysfsDir exists once the kernel runs as an SEV-SNP guest
	// (arch/x86/coco/sev: created only if
	// cc_platform_has(CC_ATTR_GUEST_SEV_SNP); Linux 6.10 and later),
	// whether or not the sev-guest driver started.
	sevSysfsDir = "/sys/devices/system/cpu/sev"
	// cpuInfo's flags hold tdx_guest, which the kernel sets itself after
	// TDX's own CPUID leaf and TDG.VP.INFO answered, and sev_snp when
	// the CPU shows SEV-SNP.
	cpuInfo = "/proc/cpuinfo"
	// kernelCmdline holds orrery.flavour, the image's flavour (below).
	kernelCmdline = "/proc/cmdline"
)

// confidentialGuest is what the kernel says of the VM's memory
// encryption: "" when none, else which and how it knows.
type confidentialGuest struct {
	SEVSNP, TDX bool
	// Evidence names what said so, for error messages.
	Evidence string
}

// readConfidentialGuest reads the kernel's view. A file that cannot be
// read other than for being absent is an error: taking it for "no
// hardware" would open the door that this check closes.
func readConfidentialGuest() (confidentialGuest, error) {
	var g confidentialGuest
	var evidence []string
	switch _, err := os.Stat(sevSysfsDir); {
	case err == nil:
		g.SEVSNP = true
		evidence = append(evidence, sevSysfsDir+" exists")
	case !errors.Is(err, os.ErrNotExist):
		return g, fmt.Errorf("ask the kernel whether this VM is an SEV-SNP guest: %w", err)
	}
	flags, err := cpuFlags(cpuInfo)
	if err != nil {
		return g, fmt.Errorf("ask the kernel whether this VM is a confidential guest: %w", err)
	}
	if slices.Contains(flags, "sev_snp") {
		g.SEVSNP = true
		evidence = append(evidence, cpuInfo+" shows sev_snp")
	}
	if slices.Contains(flags, "tdx_guest") {
		g.TDX = true
		evidence = append(evidence, cpuInfo+" shows tdx_guest")
	}
	g.Evidence = strings.Join(evidence, ", ")
	return g, nil
}

// cpuFlags is the flags line of the first processor in a /proc/cpuinfo.
func cpuFlags(path string) ([]string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	for line := range strings.SplitSeq(string(b), "\n") {
		name, value, ok := strings.Cut(line, ":")
		if ok && strings.TrimSpace(name) == "flags" {
			return strings.Fields(value), nil
		}
	}
	return nil, fmt.Errorf("%s has no flags line", path)
}

// An image is built in one of two flavours (image/build.sh), named on
// the kernel command line in its UKI, and so in its measurements:
//   - local (orrery.flavour=local): for the local cloud; may take the
//     simulated SEV-SNP its metadata offers;
//   - cloud (no orrery.flavour): for real clouds; never takes it, so a
//     host that serves simulated reports gets a node that refuses to
//     start rather than one that trusts a test root.
const (
	FlavourParam = "orrery.flavour"
	LocalFlavour = "local"
)

// localFlavour reports whether this image is the local cloud's flavour.
// Anything but the exact word is the cloud flavour, the one that trusts
// less; the initrd refuses such a command line outright.
func localFlavour() (bool, error) {
	b, err := os.ReadFile(kernelCmdline)
	if err != nil {
		return false, fmt.Errorf("read the kernel command line for the image's flavour: %w", err)
	}
	return slices.Contains(strings.Fields(string(b)), FlavourParam+"="+LocalFlavour), nil
}
