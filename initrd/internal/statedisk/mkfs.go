package statedisk

import (
	"bytes"
	"context"
	"fmt"
	"os/exec"
	"strings"
)

// E2fs makes ext4 filesystems with mke2fs (Debian package e2fsprogs).
type E2fs struct {
	// Binary is mke2fs; empty means "mke2fs" in PATH.
	Binary string
}

// MakeExt4 creates an ext4 filesystem on dev. Inode tables and the journal
// are initialised lazily by the kernel after mount, which keeps first boot
// short on a large disk.
func (e E2fs) MakeExt4(ctx context.Context, dev, label string) error {
	bin := e.Binary
	if bin == "" {
		bin = "mke2fs"
	}
	var out bytes.Buffer
	cmd := exec.CommandContext(ctx, bin, "-t", "ext4", "-q", "-F", "-L", label,
		"-E", "lazy_itable_init=1,lazy_journal_init=1", dev)
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("mke2fs %s: %w: %s", dev, err, strings.TrimSpace(out.String()))
	}
	return nil
}
