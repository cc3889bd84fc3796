// Package blockdev finds a node's block devices in sysfs (the initrd and
// bootstrapperd both need them): a
// virtio disk by its serial, a GPT partition by its name. Every function
// takes the sysfs mount point, so tests run against a fake tree.
package blockdev

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"
)

// ErrNotFound means no device matched (yet).
var ErrNotFound = errors.New("not found")

// BySerial returns the /dev path of the one whole disk whose serial (as
// virtio and SCSI disks report it in /sys/block/<dev>/serial) is serial.
// More than one such disk is an error: the initrd must not guess.
func BySerial(sysfs, serial string) (string, error) {
	entries, err := os.ReadDir(filepath.Join(sysfs, "block"))
	if err != nil {
		return "", fmt.Errorf("list block devices: %w", err)
	}
	var found []string
	for _, e := range entries {
		b, err := os.ReadFile(filepath.Join(sysfs, "block", e.Name(), "serial"))
		if err != nil {
			continue // no serial: not a virtio or SCSI disk
		}
		if strings.TrimSpace(string(b)) == serial {
			found = append(found, "/dev/"+e.Name())
		}
	}
	return one(found, fmt.Sprintf("disk with serial %q", serial))
}

// ByPartName returns the /dev path of the one partition whose GPT name
// (PARTNAME in /sys/class/block/<dev>/uevent) is name.
func ByPartName(sysfs, name string) (string, error) {
	entries, err := os.ReadDir(filepath.Join(sysfs, "class", "block"))
	if err != nil {
		return "", fmt.Errorf("list block devices: %w", err)
	}
	var found []string
	for _, e := range entries {
		u, err := readUevent(filepath.Join(sysfs, "class", "block", e.Name(), "uevent"))
		if err != nil {
			continue
		}
		if u["DEVTYPE"] == "partition" && u["PARTNAME"] == name {
			dev := u["DEVNAME"]
			if dev == "" {
				dev = e.Name()
			}
			found = append(found, "/dev/"+dev)
		}
	}
	return one(found, fmt.Sprintf("partition named %q", name))
}

func one(found []string, what string) (string, error) {
	switch len(found) {
	case 0:
		return "", fmt.Errorf("%s: %w", what, ErrNotFound)
	case 1:
		return found[0], nil
	default:
		sort.Strings(found)
		return "", fmt.Errorf("more than one %s: %s", what, strings.Join(found, ", "))
	}
}

// readUevent parses a sysfs uevent file (KEY=value lines).
func readUevent(path string) (map[string]string, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	m := map[string]string{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if k, v, ok := strings.Cut(sc.Text(), "="); ok {
			m[k] = v
		}
	}
	return m, sc.Err()
}

// Wait calls find every interval until it returns something other than
// ErrNotFound or until timeout has passed: devices appear asynchronously
// after their driver loads.
func Wait(ctx context.Context, timeout, interval time.Duration, find func() (string, error)) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	for {
		dev, err := find()
		if !errors.Is(err, ErrNotFound) {
			return dev, err
		}
		select {
		case <-ctx.Done():
			return "", fmt.Errorf("%w after waiting %s", err, timeout)
		case <-time.After(interval):
		}
	}
}
