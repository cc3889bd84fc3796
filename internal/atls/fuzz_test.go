package atls

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/orrery-dev/orrery/internal/attestation/qemu/qemutest"
)

// FuzzReadMessage feeds arbitrary bytes to the frame decoder as a peer's
// message at each step: it must return an error or a message, never
// panic, never accept a frame over its step's limit, and never read past
// the frame (the bytes after it are gRPC's).
//
// The seed corpus holds a frame of each step, one with a real attestation
// from swtpm, and frames just over a limit. Run it with a short
// -fuzzminimizetime (hack/fuzz.sh does): minimizing an input of the
// swtpm seed's size otherwise takes the default 60 s.
func FuzzReadMessage(f *testing.F) {
	if os.Getenv("ORRERY_WRITE_FUZZ_SEED") != "" {
		// Refreshes the committed seeds: ORRERY_WRITE_FUZZ_SEED=1 go test -run=FuzzReadMessage
		writeSeeds(f)
	}
	f.Add([]byte{0, 0, 0, 2, '{', '}'})
	f.Add([]byte{0xff, 0xff, 0xff, 0xff})
	attLimit := (&creds{cfg: Config{MaxAttestationSize: DefaultMaxAttestationSize}}).attestationLimit()
	steps := map[string]int{"hello": helloLimit, "verdict": envelopeLimit, "reply": attLimit}
	f.Fuzz(func(t *testing.T, data []byte) {
		for step, limit := range steps {
			r := bytes.NewReader(data)
			m, err := readMessage(r, step, limit)
			if err != nil {
				continue
			}
			n := int(binary.BigEndian.Uint32(data))
			if n > limit {
				t.Fatalf("%s: accepted a %d-byte frame over the limit of %d", step, n, limit)
			}
			if read := len(data) - r.Len(); read != 4+n {
				t.Fatalf("%s: read %d bytes of a %d-byte frame", step, read, 4+n)
			}
			var buf bytes.Buffer
			if err := writeMessage(&buf, m); err != nil {
				t.Fatalf("%s: re-encode: %v", step, err)
			}
			again, err := readMessage(&buf, step, buf.Len())
			if err != nil {
				t.Fatalf("%s: decode own encoding: %v", step, err)
			}
			a, _ := json.Marshal(m)
			b, _ := json.Marshal(again)
			if !bytes.Equal(a, b) {
				t.Fatalf("%s: round trip changed the message: %s != %s", step, a, b)
			}
		}
	})
}

func writeSeeds(tb testing.TB) {
	n := qemutest.NewNode(tb)
	doc, err := n.Issuer.Issue(context.Background(), []byte("a TLS key"), bytes.Repeat([]byte{1}, 32))
	if err != nil {
		tb.Fatal(err)
	}
	tb.Logf("a swtpm attestation document has %d bytes", len(doc))
	nonce := bytes.Repeat([]byte{7}, nonceSize)
	dir := filepath.Join("testdata", "fuzz", "FuzzReadMessage")
	frame := func(m message) []byte {
		var buf bytes.Buffer
		if err := writeMessage(&buf, m); err != nil {
			tb.Fatal(err)
		}
		return buf.Bytes()
	}
	seeds := map[string][]byte{
		"hello":                 frame(message{Nonce: nonce, Attests: true}),
		"reply-swtpm":           frame(message{Variant: n.Issuer.Variant().OID(), Attestation: doc, Nonce: nonce}),
		"verdict-error":         frame(message{Error: truncate(string(bytes.Repeat([]byte("\x00<\xff"), 1000)))}),
		"hello-then-grpc-bytes": append(frame(message{Attests: true}), "PRI * HTTP/2.0\r\n"...),
		"announces-over-hello":  binary.BigEndian.AppendUint32(nil, helloLimit+1),
		"truncated-body":        frame(message{Nonce: nonce})[:20],
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		tb.Fatal(err)
	}
	for name, b := range seeds {
		seed := fmt.Sprintf("go test fuzz v1\n[]byte(%q)\n", b)
		if err := os.WriteFile(filepath.Join(dir, name), []byte(seed), 0o644); err != nil {
			tb.Fatal(err)
		}
	}
}

// TestLimitsFitTheirMessages checks each step's limit against the largest
// honest message of that step, and the attestation limit against a real
// document from swtpm.
func TestLimitsFitTheirMessages(t *testing.T) {
	frameLen := func(m message) int {
		var buf bytes.Buffer
		if err := writeMessage(&buf, m); err != nil {
			t.Fatal(err)
		}
		return buf.Len() - 4
	}
	if n := frameLen(message{Nonce: make([]byte, nonceSize), Attests: true}); n > helloLimit {
		t.Errorf("a hello has %d bytes, more than its limit of %d", n, helloLimit)
	}
	// Every byte of this error needs JSON's longest escape.
	worstError := truncate(string(bytes.Repeat([]byte{0}, 2*maxErrorLen)))
	if n := frameLen(message{Error: worstError, Nonce: make([]byte, nonceSize)}); n > envelopeLimit {
		t.Errorf("an error message has %d bytes, more than its limit of %d", n, envelopeLimit)
	}
	n := qemutest.NewNode(t)
	doc, err := n.Issuer.Issue(context.Background(), make([]byte, 91), make([]byte, 32))
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("a swtpm attestation document has %d bytes; the default limit is %d", len(doc), DefaultMaxAttestationSize)
	if len(doc)*64 > DefaultMaxAttestationSize {
		t.Errorf("a swtpm document of %d bytes leaves too little room under DefaultMaxAttestationSize for a real firmware event log", len(doc))
	}
}
