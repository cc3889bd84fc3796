package cmdline

import (
	"strings"
	"testing"
)

const hash = "4d1c6d0a5f2f1a0c9e0b5b7f6c1e2d3a4b5c6d7e8f9a0b1c2d3e4f5a6b7c8d9e"

// trust names an image of PCRs 4, 9 and 11 as joinconn.TrustValue writes it.
const trust = "orrery.trust_join_service=" + hash + "," + hash + "," + hash

func TestParse(t *testing.T) {
	tests := map[string]struct {
		line    string
		want    Config
		wantErr string
	}{
		"minimal": {
			line: "orrery.roothash=" + hash,
			want: Config{OnFailure: PowerOff},
		},
		"with kernel parameters and newline": {
			line: "console=ttyS0 quiet orrery.roothash=" + hash + " orrery.onfailure=reboot panic=-1\n",
			want: Config{OnFailure: Reboot},
		},
		"quoted": {
			line: `foo="a b" "orrery.roothash=` + hash + `"`,
			want: Config{OnFailure: PowerOff},
		},
		"no root hash":       {line: "console=ttyS0", wantErr: "no orrery.roothash"},
		"empty":              {line: "", wantErr: "no orrery.roothash"},
		"short hash":         {line: "orrery.roothash=abcd", wantErr: "64 hex digits"},
		"not hex":            {line: "orrery.roothash=" + strings.Repeat("zz", 32), wantErr: "64 hex digits"},
		"no value":           {line: "orrery.roothash", wantErr: "needs a value"},
		"twice":              {line: "orrery.roothash=" + hash + " orrery.roothash=" + hash, wantErr: "more than once"},
		"bad failure action": {line: "orrery.roothash=" + hash + " orrery.onfailure=shell", wantErr: "poweroff or reboot"},
		"unknown parameter":  {line: "orrery.roothash=" + hash + " orrery.shell=1", wantErr: "unknown parameter orrery.shell"},
		"debug image":        {line: "orrery.roothash=" + hash + " orrery.debug=1", want: Config{OnFailure: PowerOff, Debug: true}},
		"bad debug value":    {line: "orrery.roothash=" + hash + " orrery.debug=yes", wantErr: "0 or 1"},
		"local flavour":      {line: "orrery.roothash=" + hash + " orrery.flavour=local", want: Config{OnFailure: PowerOff, LocalFlavour: true}},
		"unknown flavour":    {line: "orrery.roothash=" + hash + " orrery.flavour=cloud", wantErr: "must be local"},
		"flavour twice":      {line: "orrery.roothash=" + hash + " orrery.flavour=local orrery.flavour=local", wantErr: "more than once"},
		"unterminated quote": {line: `orrery.roothash=` + hash + ` "x`, wantErr: "unterminated quote"},
		"too long":           {line: strings.Repeat("a", MaxLen+1), wantErr: "more than"},
		// An image built with TRUST= (a rollout) boots: its initrd
		// rejoins through the older image's join services too.
		"a trusted join service": {line: "orrery.roothash=" + hash + " " + trust, want: Config{OnFailure: PowerOff, TrustedJoinServices: 1}},
		"two trusted join services": {line: trust + " orrery.roothash=" + hash + " " + trust,
			want: Config{OnFailure: PowerOff, TrustedJoinServices: 2}},
		"malformed trusted join service": {line: "orrery.roothash=" + hash + " orrery.trust_join_service=abc", wantErr: "orrery.trust_join_service: want 3"},
	}
	for name, tt := range tests {
		t.Run(name, func(t *testing.T) {
			got, err := Parse(tt.line)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("Parse() error = %v, want one containing %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got.RootHashHex() != hash || got.OnFailure != tt.want.OnFailure || got.Debug != tt.want.Debug || got.TrustedJoinServices != tt.want.TrustedJoinServices {
				t.Errorf("Parse() = %+v, want root hash %s, on failure %s", got, hash, tt.want.OnFailure)
			}
		})
	}
}

func FuzzParse(f *testing.F) {
	f.Add("console=ttyS0 orrery.roothash=" + hash + " orrery.onfailure=reboot")
	f.Add(`a="b c" orrery.roothash=` + hash)
	f.Add("orrery.roothash")
	f.Fuzz(func(t *testing.T, line string) {
		cfg, err := Parse(line)
		if err != nil {
			return
		}
		if len(cfg.RootHash) != 32 {
			t.Fatalf("accepted a root hash of %d bytes", len(cfg.RootHash))
		}
		if cfg.OnFailure != PowerOff && cfg.OnFailure != Reboot {
			t.Fatalf("accepted failure action %q", cfg.OnFailure)
		}
		// The hash must have come from the line itself.
		unquoted := strings.ReplaceAll(line, `"`, "")
		if !strings.Contains(strings.ToLower(unquoted), cfg.RootHashHex()) {
			t.Fatalf("root hash %s not in the command line", cfg.RootHashHex())
		}
	})
}
