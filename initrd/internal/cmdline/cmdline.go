// Package cmdline parses the parameters the initrd takes from the kernel
// command line. The command line is part of the measured UKI, but it is
// still parsed as untrusted input: strictly, with no parameter given twice
// and no unknown orrery.* parameter.
package cmdline

import (
	"encoding/hex"
	"errors"
	"fmt"
	"strings"

	"github.com/orrery-dev/orrery/internal/attestation/nodeattest"
	"github.com/orrery-dev/orrery/internal/joinconn"
)

// Parameters the initrd reads.
const (
	ParamRootHash  = "orrery.roothash"
	ParamOnFailure = "orrery.onfailure"
	// ParamDebug marks the debug image (orrery.debug=1). It changes what
	// is measured, so a debug node never passes a production attestation;
	// the initrd itself behaves the same.
	ParamDebug = "orrery.debug"
	// ParamTrustJoinService names an older image whose join services a
	// node of a new image accepts during a rollout (make image TRUST=);
	// it may be given more than once. The rejoin reads it through
	// joinconn, which the same parameter configures after switch-root.
	ParamTrustJoinService = joinconn.TrustParam
	// ParamFlavour names the local cloud's flavour of the image
	// (orrery.flavour=local), the only one that may take the local
	// cloud's simulated SEV-SNP. nodeattest reads it, after switch-root
	// too; it is checked here so that a bad value stops the boot.
	ParamFlavour = nodeattest.FlavourParam
)

// MaxLen bounds the command line; the kernel's own limit on x86 is 2048.
const MaxLen = 4096

// OnFailure is what the initrd does when a step fails.
type OnFailure string

const (
	PowerOff OnFailure = "poweroff"
	Reboot   OnFailure = "reboot"
)

// Config is what the initrd takes from the command line.
type Config struct {
	// RootHash is the dm-verity root hash (SHA-256) of the root partition.
	RootHash []byte
	// OnFailure is what to do when a step fails; PowerOff unless given.
	OnFailure OnFailure
	// Debug is set on the debug image.
	Debug bool
	// TrustedJoinServices counts the further images whose join services
	// the node accepts (ParamTrustJoinService).
	TrustedJoinServices int
	// LocalFlavour is set on the local cloud's flavour of the image.
	LocalFlavour bool
}

// RootHashHex returns the root hash as veritysetup takes it.
func (c Config) RootHashHex() string { return hex.EncodeToString(c.RootHash) }

// Parse parses a kernel command line (the contents of /proc/cmdline).
// Parameters that do not start with "orrery." belong to the kernel or to
// the OS and are ignored.
func Parse(line string) (Config, error) {
	cfg := Config{OnFailure: PowerOff}
	if len(line) > MaxLen {
		return cfg, fmt.Errorf("kernel command line is %d bytes, more than %d", len(line), MaxLen)
	}
	words, err := split(line)
	if err != nil {
		return cfg, err
	}
	seen := map[string]bool{}
	for _, w := range words {
		key, value, hasValue := strings.Cut(w, "=")
		if !strings.HasPrefix(key, "orrery.") {
			continue
		}
		if key == ParamTrustJoinService {
			// Checked here as joinconn will read it, so that a bad value
			// stops the boot with its reason before anything else.
			if _, err := joinconn.TrustedImages(w); err != nil {
				return cfg, err
			}
			cfg.TrustedJoinServices++
			continue
		}
		if seen[key] {
			return cfg, fmt.Errorf("%s given more than once", key)
		}
		seen[key] = true
		if !hasValue {
			return cfg, fmt.Errorf("%s needs a value (%s=...)", key, key)
		}
		switch key {
		case ParamRootHash:
			h, err := hex.DecodeString(value)
			if err != nil || len(h) != 32 {
				return cfg, fmt.Errorf("%s must be 64 hex digits (a SHA-256 dm-verity root hash), got %q", key, truncate(value))
			}
			cfg.RootHash = h
		case ParamOnFailure:
			switch OnFailure(value) {
			case PowerOff, Reboot:
				cfg.OnFailure = OnFailure(value)
			default:
				return cfg, fmt.Errorf("%s must be %s or %s, got %q", key, PowerOff, Reboot, truncate(value))
			}
		case ParamDebug:
			switch value {
			case "1":
				cfg.Debug = true
			case "0":
			default:
				return cfg, fmt.Errorf("%s must be 0 or 1, got %q", key, truncate(value))
			}
		case ParamFlavour:
			if value != nodeattest.LocalFlavour {
				return cfg, fmt.Errorf("%s must be %s (or be left out, for the cloud flavour), got %q", key, nodeattest.LocalFlavour, truncate(value))
			}
			cfg.LocalFlavour = true
		default:
			return cfg, fmt.Errorf("unknown parameter %s", truncate(key))
		}
	}
	if cfg.RootHash == nil {
		return cfg, fmt.Errorf("no %s on the kernel command line: the image was built without its dm-verity root hash", ParamRootHash)
	}
	return cfg, nil
}

// split splits a command line into words as the kernel does: on spaces,
// with double quotes grouping (and being removed).
func split(line string) ([]string, error) {
	var words []string
	var cur strings.Builder
	inWord, quoted := false, false
	for _, r := range line {
		switch {
		case r == '"':
			quoted = !quoted
			inWord = true
		case !quoted && (r == ' ' || r == '\t' || r == '\n'):
			if inWord {
				words = append(words, cur.String())
				cur.Reset()
				inWord = false
			}
		default:
			cur.WriteRune(r)
			inWord = true
		}
	}
	if quoted {
		return nil, errors.New("kernel command line has an unterminated quote")
	}
	if inWord {
		words = append(words, cur.String())
	}
	return words, nil
}

func truncate(s string) string {
	if len(s) > 80 {
		return s[:80] + "..."
	}
	return s
}
