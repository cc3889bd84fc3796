// Command nodeimage is the Go half of image/build.sh: it assembles the UKI
// and the GPT disk, predicts the measurements and writes the manifest.
//
//	nodeimage uki -stub F -kernel F -initrd F -cmdline F -osrel F -out F
//	nodeimage disk -esp F -root F -verity F -roothash HEX -out F
//	nodeimage measure -uki F [-disk F] -firmware F -out F [-events F]
//	nodeimage manifest -dir D -packages F [-components F] -info K=V... -out F
package main

import (
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	iofs "io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/orrery-dev/orrery/internal/attestation/measurements"
	"github.com/orrery-dev/orrery/internal/attestation/policy"
	"github.com/orrery-dev/orrery/internal/attestation/snp"
	"github.com/orrery-dev/orrery/internal/attestation/snp/launch"
	"github.com/orrery-dev/orrery/internal/attestation/tee"
	"github.com/orrery-dev/orrery/internal/imagebuild/diskimage"
	"github.com/orrery-dev/orrery/internal/imagebuild/pcrpredict"
	"github.com/orrery-dev/orrery/internal/imagebuild/pe"
	"github.com/orrery-dev/orrery/internal/imagebuild/uki"
)

func main() {
	if err := run(os.Args[1:], os.Stdout); err != nil {
		fmt.Fprintf(os.Stderr, "nodeimage: %v\n", err)
		os.Exit(1)
	}
}

func run(args []string, stdout io.Writer) error {
	if len(args) == 0 {
		return errors.New("usage: nodeimage uki|disk|measure|manifest [flags]")
	}
	cmds := map[string]func([]string, io.Writer) error{
		"uki": runUKI, "disk": runDisk, "measure": runMeasure, "manifest": runManifest,
	}
	cmd, ok := cmds[args[0]]
	if !ok {
		return fmt.Errorf("unknown command %q: want uki, disk, measure or manifest", args[0])
	}
	return cmd(args[1:], stdout)
}

func runUKI(args []string, _ io.Writer) error {
	fs := flag.NewFlagSet("uki", flag.ContinueOnError)
	stub := fs.String("stub", "/usr/lib/systemd/boot/efi/linuxx64.efi.stub", "systemd-stub")
	kernel := fs.String("kernel", "", "kernel (bzImage)")
	initrd := fs.String("initrd", "", "initrd")
	cmdline := fs.String("cmdline", "", "file with the kernel command line")
	osrel := fs.String("osrel", "", "os-release file")
	out := fs.String("out", "", "output UKI")
	if err := fs.Parse(args); err != nil {
		return err
	}
	read := func(path, what string) ([]byte, error) {
		if path == "" {
			return nil, fmt.Errorf("uki: -%s is required", what)
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return nil, fmt.Errorf("uki: %w", err)
		}
		return b, nil
	}
	var parts [5][]byte
	for i, f := range []struct{ path, what string }{{*stub, "stub"}, {*kernel, "kernel"}, {*initrd, "initrd"}, {*cmdline, "cmdline"}, {*osrel, "osrel"}} {
		b, err := read(f.path, f.what)
		if err != nil {
			return err
		}
		parts[i] = b
	}
	img, err := uki.Assemble(parts[0], []uki.Section{
		{Name: uki.OSRel, Data: parts[4]},
		{Name: uki.Cmdline, Data: parts[3]},
		{Name: uki.Initrd, Data: parts[2]},
		{Name: uki.Linux, Data: parts[1]},
	})
	if err != nil {
		return fmt.Errorf("uki: %w", err)
	}
	return writeFile(*out, img)
}

func runDisk(args []string, _ io.Writer) error {
	fs := flag.NewFlagSet("disk", flag.ContinueOnError)
	esp := fs.String("esp", "", "FAT image of the EFI system partition")
	root := fs.String("root", "", "root file system image")
	verity := fs.String("verity", "", "dm-verity hash tree of the root")
	rootHash := fs.String("roothash", "", "dm-verity root hash (hex)")
	out := fs.String("out", "", "output raw disk image")
	sizeGiB := fs.Int64("size-multiple-gib", 0, "round the disk's size up to a multiple of this many GiB (GCE imports only whole GiB); 0 leaves it")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *sizeGiB < 0 {
		return errors.New("disk: -size-multiple-gib must not be negative")
	}
	seed, err := hex.DecodeString(*rootHash)
	if err != nil || len(seed) == 0 || *esp == "" || *root == "" || *verity == "" || *out == "" {
		return errors.New("disk: -esp, -root, -verity, -out and a hex -roothash are required")
	}
	// The GUIDs follow from the root hash (which covers the root file
	// system), so two builds of the same tree give the same disk.
	return diskimage.Write(*out, diskimage.Spec{
		GUID:         diskimage.GUID(seed, "orrery-disk"),
		SizeMultiple: *sizeGiB << 30,
		Partitions: []diskimage.Partition{
			{Name: "esp", Type: diskimage.TypeESP, GUID: diskimage.GUID(seed, "orrery-esp"), Contents: *esp},
			{Name: "orrery-root", Type: diskimage.TypeRootX86_64, GUID: diskimage.GUID(seed, "orrery-root"), Contents: *root},
			{Name: "orrery-verity", Type: diskimage.TypeRootVerityX8664, GUID: diskimage.GUID(seed, "orrery-verity"), Contents: *verity},
		},
	})
}

func runMeasure(args []string, _ io.Writer) error {
	fs := flag.NewFlagSet("measure", flag.ContinueOnError)
	ukiPath := fs.String("uki", "", "the UKI, as it lies on the ESP at EFI/BOOT/BOOTX64.EFI")
	disk := fs.String("disk", "", "the raw disk image, whose GPT goes into PCR 5; optional")
	firmware := fs.String("firmware", "", "JSON of firmware PCR values observed under OVMF (warn-only); optional")
	out := fs.String("out", "", "output measurements.json")
	events := fs.String("events", "", "output: the predicted events, one a line; optional")
	snpFirmware := fs.String("sev-snp-firmware", "", "firmware the SEV-SNP VMs boot, whose launch measurement -sev-snp-out expects; optional")
	snpOut := fs.String("sev-snp-out", "", "output: the measurements with an SEV-SNP section (measurements-sev-snp.json); needs -sev-snp-firmware")
	if err := fs.Parse(args); err != nil {
		return err
	}
	img, err := os.ReadFile(*ukiPath)
	if err != nil {
		return fmt.Errorf("measure: %w", err)
	}
	evs, err := predictEvents(img)
	if err != nil {
		return fmt.Errorf("measure: %w", err)
	}
	if *disk != "" {
		f, err := os.Open(*disk)
		if err != nil {
			return fmt.Errorf("measure: %w", err)
		}
		pcr5, err := pcrpredict.PCR5(f)
		f.Close()
		if err != nil {
			return fmt.Errorf("measure: %s: %w", *disk, err)
		}
		evs = append(evs, pcr5...)
	}
	m := measurements.M{}
	for pcr, v := range pcrpredict.Replay(evs) {
		m[pcr] = measurements.Measurement{Expected: v}
	}
	for _, pcr := range []uint32{12, 13, 15} {
		m[pcr] = measurements.Measurement{Expected: make([]byte, measurements.DigestSize)}
	}
	if *firmware != "" {
		fw, err := loadFirmware(*firmware)
		if err != nil {
			return fmt.Errorf("measure: %w", err)
		}
		for pcr, v := range fw {
			if _, ok := m[pcr]; ok {
				return fmt.Errorf("measure: %s lists PCR %d, which is predicted", *firmware, pcr)
			}
			m[pcr] = measurements.Measurement{Expected: v, WarnOnly: true}
		}
	}
	j, err := json.Marshal(m)
	if err != nil {
		return fmt.Errorf("measure: %w", err)
	}
	var pretty strings.Builder
	if err := indent(&pretty, j); err != nil {
		return err
	}
	if err := writeFile(*out, []byte(pretty.String())); err != nil {
		return err
	}
	if *snpOut != "" {
		if err := writeSEVSNP(*snpOut, *snpFirmware, m); err != nil {
			return fmt.Errorf("measure: %w", err)
		}
	}
	if *events != "" {
		var b strings.Builder
		for _, e := range evs {
			fmt.Fprintln(&b, e)
		}
		return writeFile(*events, []byte(b.String()))
	}
	return nil
}

// predictEvents lists what the boot chain measures into PCRs 4, 9 and 11
// (PCR 5 comes from the disk, see runMeasure),
// up to the moment bootstrapperd attests (after the initrd's last marker).
func predictEvents(img []byte) ([]pcrpredict.Event, error) {
	appHash, err := pe.AuthenticodeSHA256(img)
	if err != nil {
		return nil, err
	}
	sections, err := uki.Sections(img)
	if err != nil {
		return nil, err
	}
	for _, name := range []string{uki.Linux, uki.Initrd, uki.Cmdline} {
		if len(sections[name]) == 0 {
			return nil, fmt.Errorf("the UKI has no %s section", name)
		}
	}
	kernelHash, err := pe.AuthenticodeSHA256(sections[uki.Linux])
	if err != nil {
		return nil, fmt.Errorf("kernel: %w", err)
	}
	options, err := pcrpredict.LoadOptions(sections[uki.Cmdline])
	if err != nil {
		return nil, err
	}
	evs := pcrpredict.BootApplication(appHash, `\EFI\BOOT\BOOTX64.EFI`)
	evs = append(evs, pcrpredict.UKISections(sections)...)
	evs = append(evs, pcrpredict.Kernel(kernelHash), options, pcrpredict.Initrd(sections[uki.Initrd]))
	evs = append(evs, pcrpredict.Markers(pcrpredict.EnterInitrd, pcrpredict.LeaveInitrd)...)
	return evs, nil
}

func loadFirmware(path string) (map[uint32][]byte, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var in map[string]string
	if err := json.Unmarshal(raw, &in); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	out := map[uint32][]byte{}
	for k, v := range in {
		if strings.HasPrefix(k, "_") {
			continue // a comment
		}
		var pcr uint32
		if _, err := fmt.Sscanf(k, "%d", &pcr); err != nil || pcr >= measurements.NumPCRs {
			return nil, fmt.Errorf("%s: %q is not a PCR", path, k)
		}
		b, err := hex.DecodeString(v)
		if err != nil || len(b) != measurements.DigestSize {
			return nil, fmt.Errorf("%s: PCR %d: not a SHA-256 digest in hex", path, pcr)
		}
		out[pcr] = b
	}
	return out, nil
}

func runManifest(args []string, _ io.Writer) error {
	fs := flag.NewFlagSet("manifest", flag.ContinueOnError)
	dir := fs.String("dir", "", "directory whose files get digests")
	packages := fs.String("packages", "", "mkosi's manifest (Debian packages in the tree)")
	components := fs.String("components", "", "build/components/manifest.json; optional")
	out := fs.String("out", "", "output manifest.json")
	var info multiFlag
	fs.Var(&info, "info", "KEY=VALUE to record (repeatable)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	type file struct {
		Name   string `json:"name"`
		Size   int64  `json:"size"`
		SHA256 string `json:"sha256"`
	}
	man := struct {
		Info       map[string]string `json:"info"`
		Files      []file            `json:"files"`
		Packages   []map[string]any  `json:"debianPackages"`
		Components json.RawMessage   `json:"components,omitempty"`
	}{Info: map[string]string{}}
	for _, kv := range info {
		k, v, ok := strings.Cut(kv, "=")
		if !ok {
			return fmt.Errorf("manifest: -info %q: want KEY=VALUE", kv)
		}
		man.Info[k] = v
	}
	// The cloud flavour's files are in a directory of their own.
	err := filepath.WalkDir(*dir, func(path string, e iofs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !e.Type().IsRegular() || path == filepath.Join(*dir, filepath.Base(*out)) {
			return nil
		}
		sum, size, err := sha256File(path)
		if err != nil {
			return err
		}
		name, _ := filepath.Rel(*dir, path)
		man.Files = append(man.Files, file{name, size, sum})
		return nil
	})
	if err != nil {
		return fmt.Errorf("manifest: %w", err)
	}
	if *packages != "" {
		raw, err := os.ReadFile(*packages)
		if err != nil {
			return fmt.Errorf("manifest: %w", err)
		}
		var mk struct {
			Packages []map[string]any `json:"packages"`
		}
		if err := json.Unmarshal(raw, &mk); err != nil {
			return fmt.Errorf("manifest: %s: %w", *packages, err)
		}
		for _, p := range mk.Packages {
			man.Packages = append(man.Packages, map[string]any{"name": p["name"], "version": p["version"], "architecture": p["architecture"]})
		}
	}
	if *components != "" {
		raw, err := os.ReadFile(*components)
		if err != nil {
			return fmt.Errorf("manifest: %w", err)
		}
		if !json.Valid(raw) {
			return fmt.Errorf("manifest: %s is not JSON", *components)
		}
		man.Components = raw
	}
	slices.SortFunc(man.Files, func(a, b file) int { return strings.Compare(a.Name, b.Name) })
	j, err := json.MarshalIndent(man, "", "  ")
	if err != nil {
		return err
	}
	return writeFile(*out, append(j, '\n'))
}

type multiFlag []string

func (m *multiFlag) String() string     { return strings.Join(*m, ",") }
func (m *multiFlag) Set(v string) error { *m = append(*m, v); return nil }

func indent(w *strings.Builder, j []byte) error {
	var v json.RawMessage = j
	var b strings.Builder
	enc := json.NewEncoder(&b)
	enc.SetIndent("", "  ")
	if err := enc.Encode(v); err != nil {
		return err
	}
	w.WriteString(b.String())
	return nil
}

// writeFile writes data to path through a temporary file, so a failed build
// never leaves a half-written output.
func writeFile(path string, data []byte) error {
	if path == "" {
		return errors.New("no output file given (-out)")
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, data, 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

// writeSEVSNP writes the image's measurements for SEV-SNP VMs: the PCRs,
// and an SEV-SNP section expecting the launch measurement of the
// firmware they boot (snp/launch), no debug (always), SMT allowed and no
// migration agent. A minimum TCB is the owner's to add: it depends on
// the hosts, not on the image.
func writeSEVSNP(path, firmware string, m measurements.M) error {
	if firmware == "" {
		return errors.New("-sev-snp-out needs -sev-snp-firmware")
	}
	digest, err := launch.FirmwareFile(firmware)
	if err != nil {
		return err
	}
	p := policy.Policy{PCRs: m, SEVSNP: &snp.Policy{
		Measurement: &tee.Expected{Expected: digest[:]},
		GuestPolicy: &snp.GuestPolicy{AllowSMT: true},
	}}
	j, err := p.MarshalJSON()
	if err != nil {
		return err
	}
	var pretty strings.Builder
	if err := indent(&pretty, j); err != nil {
		return err
	}
	return writeFile(path, []byte(pretty.String()))
}
