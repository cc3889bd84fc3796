package redact

import (
	"strings"
	"testing"
)

func TestSecrets(t *testing.T) {
	for in, want := range map[string]string{
		"kubeadm join --token abcdef.0123456789abcdef --discovery-token-ca-cert-hash sha256:00": "kubeadm join --token " + Redacted + " --discovery-token-ca-cert-hash sha256:00",
		"--certificate-key " + strings.Repeat("ab", 32):                                         "--certificate-key " + Redacted,
		"Authorization: Bearer eyJhbGciOiJSUzI1NiIsImtpZCI6":                                    "Authorization: Bearer " + Redacted,
		"cut short: -----BEGIN PRIVATE KEY-----\nMIIE":                                          "cut short: " + Redacted,
		"node cp-0.example is Ready":                                                            "node cp-0.example is Ready",
		"    client-key-data: LS0tLS1CRUdJTiBFQyBQUklWQVRFIEtFWS0tLS0t":                         "    client-key-data: " + Redacted,
	} {
		if got := Secrets(in); got != want {
			t.Errorf("Secrets(%q) = %q, want %q", in, got, want)
		}
	}
}

// A private key printed a line at a time goes whole, from its BEGIN line
// to its END line, and what follows it stays.
func TestLines(t *testing.T) {
	in := []string{
		"[certs] the key:",
		"-----BEGIN EC PRIVATE KEY-----",
		"MHcCAQEEIBkV3mXq0Qh9aXl2rK0PvWc1s2M1y8i8a0R2e1Zq5m1xoAoGCCqGSM49",
		"AwEHoUQDQgAE",
		"-----END EC PRIVATE KEY----- done",
		"[upgrade] token abcdef.0123456789abcdef",
		"[upgrade] SUCCESS",
	}
	want := []string{
		"[certs] the key:",
		Redacted,
		Redacted,
		Redacted,
		Redacted + " done",
		"[upgrade] token " + Redacted,
		"[upgrade] SUCCESS",
	}
	var l Lines
	for i, line := range in {
		if got := l.Line(line); got != want[i] {
			t.Errorf("line %d: %q, want %q", i, got, want[i])
		}
	}
	// A key on one line ends on it.
	var one Lines
	if got := one.Line("x -----BEGIN PRIVATE KEY-----AAAA-----END PRIVATE KEY----- y"); got != "x "+Redacted+" y" {
		t.Errorf("a key on one line: %q", got)
	}
	if got := one.Line("next"); got != "next" {
		t.Errorf("the line after a one-line key: %q", got)
	}
}
