package vm

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os/exec"
	"strconv"
	"strings"
)

// QEMUImgBinary is the qemu-img executable looked up in PATH.
const QEMUImgBinary = "qemu-img"

// createOverlay creates a qcow2 image at path whose reads fall through to
// base and whose writes stay in path.
func createOverlay(ctx context.Context, path, base string) error {
	// Name the base's format: qemu-img refuses to guess it for a backing
	// file, since a guessed raw image could pass itself off as qcow2.
	out, err := qemuImg(ctx, "info", "--output=json", base)
	if err != nil {
		return fmt.Errorf("inspect disk image: %w", err)
	}
	var info struct {
		Format string `json:"format"`
	}
	if err := json.Unmarshal(out, &info); err != nil || info.Format == "" {
		return fmt.Errorf("inspect disk image %s: unexpected qemu-img output %.200q", base, out)
	}
	if _, err := qemuImg(ctx, "create", "-q", "-f", "qcow2", "-F", info.Format, "-b", base, path); err != nil {
		return fmt.Errorf("create overlay disk: %w", err)
	}
	return nil
}

// createBlank creates an empty qcow2 image of sizeMiB at path.
func createBlank(ctx context.Context, path string, sizeMiB int) error {
	if _, err := qemuImg(ctx, "create", "-q", "-f", "qcow2", path, strconv.Itoa(sizeMiB)+"M"); err != nil {
		return fmt.Errorf("create state disk: %w", err)
	}
	return nil
}

// qemuImg runs qemu-img and returns its standard output; its error output
// becomes the error.
func qemuImg(ctx context.Context, args ...string) ([]byte, error) {
	path, err := exec.LookPath(QEMUImgBinary)
	if err != nil {
		return nil, fmt.Errorf("%s not found in PATH: install it with 'make deps' (Debian package qemu-utils): %w", QEMUImgBinary, err)
	}
	var stdout, stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, path, args...)
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return nil, fmt.Errorf("qemu-img %s: %w: %s", args[0], err, strings.TrimSpace(stderr.String()))
	}
	return stdout.Bytes(), nil
}
