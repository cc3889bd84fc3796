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
	} {
		if got := Secrets(in); got != want {
			t.Errorf("Secrets(%q) = %q, want %q", in, got, want)
		}
	}
}
