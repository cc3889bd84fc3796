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

// testKeyLines is an EC private key as a tool that echoes a key file
// prints it, a line at a time.
var testKeyLines = []string{
	"-----BEGIN EC PRIVATE KEY-----",
	"MHcCAQEEIBkV3mXq0Qh9aXl2rK0PvWc1s2M1y8i8a0R2e1Zq5m1xoAoGCCqGSM49",
	"AwEHoUQDQgAEq3Vh0Qx1n6m2TzYbXb2Q1n1q7w8eJmL0k9D1mYx6T1s3QfH2b5Rj",
	"Zk8lR2mQw==",
	"-----END EC PRIVATE KEY-----",
}

// A reader that starts inside a key, as 'orrery logs -n 3' can, does not
// show the rest of its body; the text after the key it shows.
func TestMidStream(t *testing.T) {
	for name, c := range map[string]struct{ in, want []string }{
		"body, end, more": {
			in:   append(append([]string{}, testKeyLines[2:]...), "Started kubelet"),
			want: []string{Redacted, Redacted, Redacted, "Started kubelet"},
		},
		"one entry with the body, the end and more": {
			in:   []string{strings.Join(testKeyLines[1:], "\n") + " done\nnext line"},
			want: []string{Redacted + " done\nnext line"},
		},
		"one entry with the body, then a line": {
			in:   []string{strings.Join(testKeyLines[1:3], "\n") + "\nStarted kubelet"},
			want: []string{Redacted + "\nStarted kubelet"},
		},
		"ordinary first lines": {
			in:   []string{"Started", "Stopped kubelet", "abcdefghijKLMNOP and more"},
			want: []string{"Started", "Stopped kubelet", "abcdefghijKLMNOP and more"},
		},
		"a whole key first": {
			in:   append(append([]string{}, testKeyLines...), "after"),
			want: []string{Redacted, Redacted, Redacted, Redacted, Redacted, "after"},
		},
		"a key on one line first": {
			in:   []string{"x -----BEGIN PRIVATE KEY-----AAAA-----END PRIVATE KEY----- y"},
			want: []string{"x " + Redacted + " y"},
		},
	} {
		l := MidStream()
		for i, line := range c.in {
			if got := l.Line(line); got != c.want[i] {
				t.Errorf("%s: line %d: %q, want %q", name, i, got, c.want[i])
			}
		}
	}
}

// Several writers' lines interleaved, the reader starting anywhere: no
// line of the key's body comes through, and the other writer's lines do.
func FuzzWritersHideAKeyPrintedALineAtATime(f *testing.F) {
	f.Add(uint64(0), uint8(0))
	f.Add(uint64(0b1010101010), uint8(3))
	f.Add(uint64(0xffff), uint8(9))
	f.Fuzz(func(t *testing.T, interleave uint64, start uint8) {
		type line struct{ writer, text string }
		var all []line
		key := 0
		for i := 0; key < len(testKeyLines); i++ {
			if interleave>>(i%64)&1 == 1 {
				all = append(all, line{"kubelet[42]", "I1201 SyncLoop pod=" + string(rune('a'+i%26))})
				continue
			}
			all = append(all, line{"tool[7]", testKeyLines[key]})
			key++
		}
		all = append(all, line{"tool[7]", "tool done"})
		var w Writers
		for _, l := range all[int(start)%len(all):] {
			got := w.Line(l.writer, l.text)
			for _, body := range testKeyLines[1:4] {
				if strings.Contains(got, body) {
					t.Fatalf("key line %q came through as %q", body, got)
				}
			}
			if l.writer == "kubelet[42]" && got != l.text {
				t.Fatalf("another writer's line %q came out as %q", l.text, got)
			}
			if l.text == "tool done" && got != l.text {
				t.Fatalf("the line after the key came out as %q", got)
			}
		}
	})
}
