// Package initrdbuild builds the node's initrd with u-root's mkuimage: the
// Go /init (initrd/init), the kernel modules it loads for one Debian cloud
// kernel release, and the few tools it runs (cryptsetup, veritysetup,
// dmsetup, mke2fs) with their shared libraries and the dynamic loader. The archive
// is reproducible (fixed mtimes and owners, sorted entries, a stripped
// -trimpath binary) and compressed with zstd.
package initrdbuild

import (
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/klauspost/compress/zstd"
	"github.com/orrery-dev/orrery/initrd/internal/modules"
	"github.com/orrery-dev/orrery/internal/nodepackages"
	"github.com/u-root/mkuimage/cpio"
	"github.com/u-root/mkuimage/uimage"
	"github.com/u-root/uio/llog"
)

// InitPackage is the Go package of /init.
const InitPackage = "github.com/orrery-dev/orrery/initrd/init"

// Tools are the host programs the initrd carries, at the same paths.
// dmsetup reads back the state disk's device-mapper table once opened
// (cryptsetup.Tool.CheckMapping); its libraries are cryptsetup's.
var Tools = []string{"/usr/sbin/cryptsetup", "/usr/sbin/veritysetup", "/usr/sbin/dmsetup", "/usr/sbin/mke2fs"}

// toolPackages names the Debian package of each tool, for error messages.
var toolPackages = map[string]string{
	"/usr/sbin/cryptsetup": "cryptsetup-bin", "/usr/sbin/veritysetup": "cryptsetup-bin", "/usr/sbin/dmsetup": "dmsetup",
	"/usr/sbin/mke2fs": "e2fsprogs",
}

// configFiles are host configuration files the tools read.
var configFiles = []string{"/etc/mke2fs.conf"}

// OutputName is the initrd's file name in the output directory.
const OutputName = "initrd.cpio.zst"

// Options configure Build. The zero value builds for the kernel the
// checkout pins (nodepackages) and reports progress to stderr.
type Options struct {
	// Kernel is the kernel whose modules go in; the zero value means the
	// one the checkout pins.
	Kernel nodepackages.KernelPackage
	// ToolsRoot is an OS tree (the image's, whose packages the lock pins)
	// whose tools, their libraries and configuration go in; "" means the
	// build host's, which the tests' initrds take.
	ToolsRoot string
	// Log receives progress lines; nil means os.Stderr.
	Log io.Writer
}

// Result describes a built initrd.
type Result struct {
	Path    string
	Release string
	Size    int64 // compressed
	RawSize int64 // uncompressed cpio
}

// Build writes outDir/initrd.cpio.zst. It must run inside the Orrery
// module (it builds InitPackage with the go command).
func Build(outDir string, o Options) (Result, error) {
	var res Result
	logw := o.Log
	if logw == nil {
		logw = os.Stderr
	}
	total := time.Now()
	phase := func(name string, start time.Time) {
		fmt.Fprintf(logw, "initrd: %-8s %6.2fs\n", name, time.Since(start).Seconds())
	}

	start := time.Now()
	k := o.Kernel
	if k.Root == "" {
		var err error
		if k, err = nodepackages.Kernel(); err != nil {
			return res, err
		}
	}
	res.Release = k.Release
	if o.ToolsRoot == "" {
		if err := checkTools(); err != nil {
			return res, err
		}
	}
	base, err := baseArchive(k.Root, res.Release)
	if err != nil {
		return res, fmt.Errorf("kernel modules of %s: %w", res.Release, err)
	}
	phase("modules", start)
	fmt.Fprintf(logw, "initrd: kernel %s, %d modules\n", res.Release, len(modules.Names))

	if err := os.MkdirAll(outDir, 0o755); err != nil {
		return res, fmt.Errorf("create %s: %w", outDir, err)
	}
	tmp, err := os.MkdirTemp(outDir, ".initrd-build-")
	if err != nil {
		return res, fmt.Errorf("create a build directory: %w", err)
	}
	defer os.RemoveAll(tmp)

	start = time.Now()
	if err := addInit(base, tmp); err != nil {
		return res, err
	}
	phase("go-build", start)

	start = time.Now()
	rawPath := filepath.Join(tmp, "initrd.cpio")
	if o.ToolsRoot != "" {
		if err := addTreeTools(base, o.ToolsRoot); err != nil {
			return res, fmt.Errorf("the tools of the OS tree %s: %w", o.ToolsRoot, err)
		}
	}
	if err := addTools(base, tmp, rawPath, o.ToolsRoot == "", logw); err != nil {
		return res, err
	}
	phase("mkuimage", start)

	start = time.Now()
	res.Path = filepath.Join(outDir, OutputName)
	if res.RawSize, res.Size, err = compress(rawPath, res.Path); err != nil {
		return res, fmt.Errorf("compress the initrd: %w", err)
	}
	phase("compress", start)
	phase("total", total)
	fmt.Fprintf(logw, "initrd: %s: %.1f MB (%.1f MB uncompressed)\n", res.Path, float64(res.Size)/1e6, float64(res.RawSize)/1e6)
	return res, nil
}

// checkTools fails, saying what to install, if a tool the initrd carries
// or the go command is missing.
func checkTools() error {
	for _, t := range Tools {
		if _, err := os.Stat(t); err != nil {
			return fmt.Errorf("%s missing: install Debian package %s (make deps)", t, toolPackages[t])
		}
	}
	if _, err := exec.LookPath("go"); err != nil {
		return fmt.Errorf("the go command is not in PATH (add /usr/local/go/bin): %w", err)
	}
	return nil
}

// addInit builds /init into base. It is built here rather than by
// mkuimage, whose builder passes -a (rebuilding the standard library every
// time); -trimpath and an empty build ID keep it reproducible all the same.
func addInit(base *cpio.Archive, tmp string) error {
	initBin := filepath.Join(tmp, "init")
	cmd := exec.Command("go", "build", "-trimpath", "-ldflags=-s -w -buildid=", "-o", initBin, InitPackage)
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("go build %s: %w\n%s", InitPackage, err, out)
	}
	initContent, err := os.ReadFile(initBin)
	if err != nil {
		return fmt.Errorf("read the built /init: %w", err)
	}
	if err := base.WriteRecord(cpio.StaticRecord(initContent, cpio.Info{Name: "init", Mode: cpio.S_IFREG | 0o755})); err != nil {
		return fmt.Errorf("add /init: %w", err)
	}
	return nil
}

// addTools has mkuimage write base to the cpio at rawPath, with the build
// host's tools and configuration files (and the libraries they need,
// found by ldd) if fromHost; an image's initrd has its tree's in base.
func addTools(base *cpio.Archive, tmp, rawPath string, fromHost bool, logw io.Writer) error {
	var files []string
	for _, t := range append(append([]string{}, Tools...), configFiles...) {
		if fromHost {
			files = append(files, t+":"+strings.TrimPrefix(t, "/"))
		}
	}
	l := llog.New(slog.LevelWarn, llog.WritePrintf(logw))
	err := uimage.Create(l,
		uimage.WithTempDir(tmp),
		uimage.WithBaseArchive(base),
		uimage.WithExistingInit(true),
		uimage.WithFiles(files...),
		uimage.WithCPIOOutput(rawPath),
	)
	if err != nil {
		return fmt.Errorf("mkuimage: %w", err)
	}
	return nil
}

// baseArchive holds the directories /init needs and the kernel modules.
func baseArchive(root, release string) (*cpio.Archive, error) {
	mods, err := modules.Files(root, release)
	if err != nil {
		return nil, err
	}
	recs := []cpio.Record{
		cpio.Directory("dev", 0o755), cpio.Directory("proc", 0o755), cpio.Directory("sys", 0o755),
		cpio.Directory("run", 0o755), cpio.Directory("sysroot", 0o755), cpio.Directory("tmp", 0o1777),
		cpio.CharDev("dev/console", 0o600, 5, 1), cpio.CharDev("dev/null", 0o666, 1, 3),
	}
	modDir := filepath.Join("lib/modules", release)
	for _, rel := range append(modules.MetaFiles, mods...) {
		b, err := os.ReadFile(filepath.Join(root, modDir, rel))
		if err != nil {
			return nil, fmt.Errorf("kernel modules: %w", err)
		}
		rel, b, err := modules.Unpacked(rel, b)
		if err != nil {
			return nil, err
		}
		recs = append(recs, cpio.StaticFile(filepath.Join(modDir, rel), string(b), 0o644))
	}
	return cpio.ArchiveFromRecords(recs)
}

// compress writes src compressed with zstd to dst and returns both sizes.
// One encoder goroutine and a fixed level give the same bytes every time.
func compress(src, dst string) (raw, out int64, err error) {
	in, err := os.Open(src)
	if err != nil {
		return 0, 0, err
	}
	defer in.Close()
	tmp := dst + ".tmp"
	f, err := os.Create(tmp)
	if err != nil {
		return 0, 0, err
	}
	defer os.Remove(tmp)
	enc, err := zstd.NewWriter(f, zstd.WithEncoderLevel(zstd.SpeedBestCompression), zstd.WithEncoderConcurrency(1))
	if err != nil {
		f.Close()
		return 0, 0, err
	}
	raw, err = io.Copy(enc, in)
	if cerr := enc.Close(); err == nil {
		err = cerr
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return 0, 0, fmt.Errorf("compress initrd: %w", err)
	}
	fi, err := os.Stat(tmp)
	if err != nil {
		return 0, 0, err
	}
	return raw, fi.Size(), os.Rename(tmp, dst)
}
