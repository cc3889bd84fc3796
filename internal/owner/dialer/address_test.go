package dialer

import (
	"strings"
	"testing"
)

func TestParseAddress(t *testing.T) {
	good := map[string]string{
		"10.42.1.100":          "10.42.1.100:9000",
		"10.42.1.100:9123":     "10.42.1.100:9123",
		"::1":                  "[::1]:9000",
		"[::1]":                "[::1]:9000",
		"[::1]:9001":           "[::1]:9001",
		"[fd00::1]":            "[fd00::1]:9000",
		"cp-0.example":         "cp-0.example:9000",
		"cp-0.example:443":     "cp-0.example:443",
		"Node-1":               "Node-1:9000",
		"2001:db8::8a2e:370:1": "[2001:db8::8a2e:370:1]:9000",
		"fe80::1%eth0":         "[fe80::1%eth0]:9000",
		"[fe80::1%eth0]:9001":  "[fe80::1%eth0]:9001",
	}
	for in, want := range good {
		got, err := ParseAddress(in, 9000)
		if err != nil || got != want {
			t.Errorf("ParseAddress(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	bad := map[string]string{
		"":                      "no host",
		"https://10.42.1.100":   `drop "https://"`,
		"10.42.1.100:9000/path": "no path",
		"10.42.1.100:0":         "1 to 65535",
		"10.42.1.100:65536":     "1 to 65535",
		"10.42.1.100:http":      "1 to 65535",
		"[10.42.1.100]":         "not an IPv6 address",
		"[::1":                  "cannot split",
		"bad_name":              "neither an IP address nor a host name",
		":9000":                 "no host",
		"10.42.1.100 9000":      "spaces",
		"::%[":                  "interface name",
		"[fe80::1%a:b]":         "interface name",
	}
	for in, want := range bad {
		got, err := ParseAddress(in, 9000)
		if err == nil {
			t.Errorf("ParseAddress(%q) = %q; want an error", in, got)
			continue
		}
		if !strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), "want HOST") {
			t.Errorf("ParseAddress(%q): %v; want it to say %q and what is accepted", in, err, want)
		}
	}
}

func FuzzParseAddress(f *testing.F) {
	for _, s := range []string{"10.42.1.100", "[::1]:9001", "https://x", "cp-0:1", "[", ":", "::%[", "fe80::1%eth0"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		addr, err := ParseAddress(s, 9000)
		if err != nil {
			return
		}
		// What it returns it accepts again, unchanged.
		again, err := ParseAddress(addr, 1)
		if err != nil || again != addr {
			t.Fatalf("ParseAddress(%q) = %q, which parses to %q, %v", s, addr, again, err)
		}
	})
}
