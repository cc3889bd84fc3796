package console

import (
	"bytes"
	"errors"
	"strconv"
	"strings"
	"testing"
)

const testNonce = "0123456789abcdef"

// Markers as a shell prints them on a terminal.
const (
	ready = "ORRREADY-" + testNonce + "\r\n"
	begin = "ORRBEGIN-" + testNonce + "\r\n"
	end   = "ORREND-" + testNonce + ":"
)

type scanResult struct {
	done, started bool
	output        string
	code          int
	err           error
}

// scanAll feeds the scanner chunks of at most size bytes (all at once if
// size is 0).
func scanAll(data []byte, size int) scanResult {
	s := newScanner(testNonce)
	if size <= 0 {
		size = len(data) + 1
	}
	for len(data) > 0 {
		n := min(size, len(data))
		if err := s.feed(data[:n]); err != nil {
			return scanResult{err: err}
		}
		data = data[n:]
	}
	return scanResult{done: s.done(), started: s.started(), output: s.output(), code: s.code}
}

func TestScanner(t *testing.T) {
	prompt := "\x1b[?2004hroot@node:~# "
	echo := `printf '%s-%s\n' ORRBEGIN ` + testNonce + `; ... printf '%s-%s:%s\n' ORREND ` + testNonce + ` "$?"` + "\r\n"
	tests := map[string]struct {
		printed    string
		wantDone   bool
		wantOutput string
		wantCode   int
		wantErr    bool
	}{
		"a command with output": {
			printed:    "[  1.0] kernel says hi\r\n" + ready + prompt + echo + begin + "a\r\nb\r\n" + end + "0\r\n" + prompt,
			wantDone:   true,
			wantOutput: "a\nb\n",
		},
		"no output, non-zero status": {
			printed:  ready + begin + end + "3\r\n",
			wantDone: true, wantCode: 3,
		},
		"output without a final newline": {
			printed:  ready + begin + "abc" + end + "0\r\n",
			wantDone: true, wantOutput: "abc",
		},
		"another nonce's markers are output": {
			printed:  ready + begin + "ORRBEGIN-00\r\nORREND-00:1\r\n" + end + "0\r\n",
			wantDone: true, wantOutput: "ORRBEGIN-00\nORREND-00:1\n",
		},
		"begin before ready does not count": {
			printed: begin + "x\r\n" + end + "0\r\n" + ready,
		},
		"the echo of the typed line is no marker": {
			printed: ready + echo,
		},
		"status not complete": {
			printed: ready + begin + "out\r\n" + end + "12",
		},
		"status not a number": {
			printed: ready + begin + end + "x\r\n",
			wantErr: true,
		},
		"status out of range": {
			printed: ready + begin + end + "256\r\n",
			wantErr: true,
		},
		"status too long, no newline yet": {
			printed: ready + begin + end + "0000",
			wantErr: true,
		},
		"what follows the end is ignored": {
			printed:  ready + begin + "o\r\n" + end + "1\r\n" + begin + "p\r\n" + end + "x\r\n",
			wantDone: true, wantOutput: "o\n", wantCode: 1,
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			// Whole, and a byte at a time: markers split across reads.
			for _, size := range []int{0, 1} {
				got := scanAll([]byte(tc.printed), size)
				if (got.err != nil) != tc.wantErr {
					t.Fatalf("chunks of %d: error %v, want error %v", size, got.err, tc.wantErr)
				}
				if tc.wantErr {
					continue
				}
				if got.done != tc.wantDone || got.done && (got.output != tc.wantOutput || got.code != tc.wantCode) {
					t.Errorf("chunks of %d: done %v, output %q, status %d; want %v, %q, %d",
						size, got.done, got.output, got.code, tc.wantDone, tc.wantOutput, tc.wantCode)
				}
			}
		})
	}
}

// TestScannerBounds: a guest cannot make the scanner hold more than
// maxOutput of output, nor much of the noise before it.
func TestScannerBounds(t *testing.T) {
	s := newScanner(testNonce)
	noise := bytes.Repeat([]byte("noise, no marker\r\n"), 1<<12)
	for range 64 {
		if err := s.feed(noise); err != nil {
			t.Fatal(err)
		}
	}
	if len(s.buf) > maxNoise {
		t.Errorf("scanner holds %d bytes of noise, want at most %d", len(s.buf), maxNoise)
	}
	// A marker split between two reads, the first of which makes the
	// scanner trim, is still found.
	if err := s.feed(append(noise, ready[:5]...)); err != nil {
		t.Fatal(err)
	}
	if err := s.feed([]byte(ready[5:] + begin)); err != nil {
		t.Fatal(err)
	}
	if !s.started() {
		t.Fatal("markers after the noise not found")
	}
	out := bytes.Repeat([]byte("x"), 1<<20)
	var err error
	for i := 0; i <= maxOutput>>20 && err == nil; i++ {
		err = s.feed(out)
	}
	if !errors.Is(err, errTooMuchOutput) {
		t.Errorf("after %d MiB of output: error %v, want errTooMuchOutput", maxOutput>>20+1, err)
	}
}

// FuzzScanner feeds the scanner arbitrary bytes, as a guest may print
// anything: it must not panic, must not depend on how the bytes are split
// into reads, and an output it finds must be what the bytes hold.
func FuzzScanner(f *testing.F) {
	f.Add([]byte(ready+begin+"out\r\n"+end+"0\r\n"), uint16(7))
	f.Add([]byte(ready+begin+end+"255\r\n"), uint16(30))
	f.Add([]byte("ORRREADY-"+ready+"ORRBEGIN-ORRBEGIN-"+begin+"ORREND-"+end+"1\n"), uint16(40))
	f.Fuzz(func(t *testing.T, data []byte, cut uint16) {
		whole := scanAll(data, 0)
		s := newScanner(testNonce)
		split := int(cut) % (len(data) + 1)
		var err error
		if err = s.feed(data[:split]); err == nil {
			err = s.feed(data[split:])
		}
		if (err != nil) != (whole.err != nil) {
			t.Fatalf("split at %d: error %v; whole: %v", split, err, whole.err)
		}
		if err != nil {
			return
		}
		if s.done() != whole.done || s.output() != whole.output || s.code != whole.code {
			t.Fatalf("split at %d: %v %q %d; whole: %v %q %d", split, s.done(), s.output(), s.code, whole.done, whole.output, whole.code)
		}
		if !whole.done {
			return
		}
		clean := strings.ReplaceAll(string(data), "\r", "")
		framed := strings.TrimSuffix(begin, "\r\n") + "\n" + whole.output + end + strconv.Itoa(whole.code) + "\n"
		if !strings.Contains(clean, framed) {
			t.Fatalf("output %q, status %d are not framed by markers in %q", whole.output, whole.code, clean)
		}
		if whole.code < 0 || whole.code > 255 || strings.Contains(whole.output, end) {
			t.Fatalf("output %q, status %d", whole.output, whole.code)
		}
	})
}

// FuzzScannerOutput frames arbitrary output and noise as a shell prints
// them: the scanner must return the output, without carriage returns, and
// the status.
func FuzzScannerOutput(f *testing.F) {
	f.Add([]byte("root@node:~# "), []byte("line 1\r\nline 2\r\n"), uint8(0), []byte("root@node:~# "))
	f.Add([]byte(""), []byte(""), uint8(255), []byte(""))
	f.Add([]byte("ORRBEGIN-0123\r\n"), []byte("ORREND-"+testNonce), uint8(3), []byte(end+"x"))
	f.Fuzz(func(t *testing.T, noise, output []byte, code uint8, after []byte) {
		clean := func(b []byte) []byte { return bytes.ReplaceAll(b, []byte("\r"), nil) }
		// Output holding the end marker, or noise holding the begin
		// marker, cannot be told apart from the real ones: Run's nonce is
		// random and unknown to the guest beforehand.
		if bytes.Contains(clean(noise), []byte(strings.TrimSuffix(begin, "\r\n")+"\n")) || bytes.Contains(clean(output), []byte(end)) {
			t.Skip()
		}
		var printed []byte
		for _, part := range [][]byte{noise, []byte(ready), noise, []byte(begin), output, []byte(end + strconv.Itoa(int(code)) + "\r\n"), after} {
			printed = append(printed, part...)
		}
		for _, size := range []int{0, 3} {
			got := scanAll(printed, size)
			if got.err != nil || !got.done || got.output != string(clean(output)) || got.code != int(code) {
				t.Fatalf("chunks of %d: %+v; want output %q, status %d", size, got, clean(output), code)
			}
		}
	})
}
