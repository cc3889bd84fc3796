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

// everyRegexp is Secrets without the prefilters: what Secrets must equal.
func everyRegexp(s string) string {
	for _, p := range secretPatterns {
		s = p.re.ReplaceAllString(s, p.with)
	}
	return s
}

// The prefilters only skip regexps that cannot match: Secrets gives what
// every regexp would, on secrets, near misses and folded letters.
func FuzzSecretsSkipsOnlyWhatCannotMatch(f *testing.F) {
	for _, s := range []string{
		"kubeadm join --token abcdef.0123456789abcdef", "x.abcdef.0123456789abcdef_", "abcde.0123456789abcdef",
		"CERTIFICATE-KEY=" + strings.Repeat("0f", 32), "Certificate_key: " + strings.Repeat("A", 64),
		"\u212aey-data", "client-\u212aey-data: abc", "PRIVATE-KEY-DATA:\tx", "BeArEr 0123456789abcdef0", "bearer\n0123456789abcdefXYZ",
		"-----BEGIN RSA PRIVATE KEY-----\nAAA\n-----END RSA PRIVATE KEY-----", "-----BEGIN CERTIFICATE-----",
		`I1201 kubelet.go:2479] "SyncLoop (PLEG): event for pod" pod="kube-system/kube-proxy-3"`,
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		if got, want := Secrets(s), everyRegexp(s); got != want {
			t.Errorf("Secrets(%q) = %q; the regexps give %q", s, got, want)
		}
	})
}

// BenchmarkSecrets is a journal line that holds no secret, as most do.
func BenchmarkSecrets(b *testing.B) {
	line := `I1201 01:02:03.123456    1042 kubelet.go:2479] "SyncLoop (PLEG): event for pod" pod="kube-system/kube-proxy-x7k2p" event={"ID":"0c5f2d1e","Type":"ContainerStarted","Data":"4b1c9a"}`
	for name, redact := range map[string]func(string) string{"prefiltered": Secrets, "every regexp": everyRegexp} {
		b.Run(name, func(b *testing.B) {
			for b.Loop() {
				redact(line)
			}
		})
	}
}
