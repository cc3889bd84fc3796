package console

import (
	"bytes"
	"errors"
	"strconv"
	"strings"
	"testing"
)

const testNonce = "0123456789abcdef"

// Markers and the line prefix as a terminal shows them.
const (
	ready  = "ORRREADY-" + testNonce + "\r\n"
	begin  = "ORRBEGIN-" + testNonce + "\r\n"
	prefix = "ORRLINE-" + testNonce + " "
	end    = "ORREND-" + testNonce + ":"
)

// framed is what the line shows of a command's output and exit status:
// each line prefixed, and noise (lines without the prefix, if any) after
// each of them.
func framed(output string, code int, noise string) string {
	var b strings.Builder
	for _, line := range strings.SplitAfter(output+end+strconv.Itoa(code)+"\n", "\n") {
		if line == "" {
			continue
		}
		b.WriteString(prefix + strings.TrimSuffix(line, "\n") + "\r\n")
		if noise != "" {
			b.WriteString(noise + "\r\n")
		}
	}
	return b.String()
}

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

// What a terminal shows besides the framed output: the shell's prompt,
// the echo of the line Run types, and a line of the journal.
var (
	scanPrompt  = "\x1b[?2004hroot@node:~# "
	scanEcho    = `printf '%s-%s\n' ORRBEGIN ` + testNonce + `; { ... printf '%s-%s:%s\n' ORREND ` + testNonce + ` "$?"; } | sed 's/^/ORRLINE-''` + testNonce + ` /'` + "\r\n"
	scanJournal = "[   29.715509] systemd[1]: var-lib-containerd.mount: Deactivated successfully."
)

var scannerCases = map[string]struct {
	printed    string
	wantDone   bool
	wantOutput string
	wantCode   int
	wantErr    bool
}{
	"a command with output": {
		printed:  "[  1.0] kernel says hi\r\n" + ready + scanPrompt + scanEcho + begin + framed("a\nb\n", 0, "") + scanPrompt,
		wantDone: true, wantOutput: "a\nb\n",
	},
	"lines without the prefix are dropped": {
		printed:  ready + begin + scanJournal + "\r\n" + framed("a\nb\n", 0, scanJournal) + "Terminated\r\n",
		wantDone: true, wantOutput: "a\nb\n",
	},
	// journald's non-blocking write cut in two by a full terminal
	// buffer, with a whole output line in between.
	"an output line inside a journal line": {
		printed:    ready + begin + prefix + "a\r\n" + scanJournal[:20] + prefix + "b\r\n" + scanJournal[20:] + "\r\n" + prefix + end + "0\r\n",
		wantDone:   true,
		wantOutput: "a\nb\n",
	},
	"no output, non-zero status": {
		printed:  ready + begin + framed("", 3, ""),
		wantDone: true, wantCode: 3,
	},
	"output without a final newline": {
		printed:  ready + begin + framed("abc", 0, ""),
		wantDone: true, wantOutput: "abc",
	},
	"markers and prefixes of another nonce": {
		printed:  ready + begin + framed("ORRBEGIN-00\nORRLINE-00 x\nORREND-00:1\n", 0, "ORRLINE-00 y"),
		wantDone: true, wantOutput: "ORRBEGIN-00\nORRLINE-00 x\nORREND-00:1\n",
	},
	"begin before ready does not count": {
		printed: begin + framed("x\n", 0, "") + ready,
	},
	"the echo of the typed line is no marker": {
		printed: ready + scanPrompt + scanEcho,
	},
	"an end marker without the prefix is noise": {
		printed: ready + begin + prefix + "out\r\n" + end + "0\r\n",
	},
	"end line not complete": {
		printed: ready + begin + prefix + "out\r\n" + prefix + end + "0",
	},
	"status not a number": {
		printed: ready + begin + prefix + end + "x\r\n",
		wantErr: true,
	},
	"status out of range": {
		printed: ready + begin + framed("", 256, ""),
		wantErr: true,
	},
	"status with a leading zero": {
		printed: ready + begin + prefix + end + "01\r\n",
		wantErr: true,
	},
	"what follows the end is ignored": {
		printed:  ready + begin + framed("o\n", 1, "") + begin + framed("p\n", 2, ""),
		wantDone: true, wantOutput: "o\n", wantCode: 1,
	},
}

func TestScanner(t *testing.T) {
	for name, tc := range scannerCases {
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

// TestScannerBounds: a guest cannot make the scanner hold much of the
// noise around the output, nor more than maxOutput of output.
func TestScannerBounds(t *testing.T) {
	s := newScanner(testNonce)
	noise := bytes.Repeat([]byte("noise, no marker\r\n"), 1<<12)
	for range 64 {
		if err := s.feed(noise); err != nil {
			t.Fatal(err)
		}
	}
	if len(s.raw) > maxNoise {
		t.Errorf("scanner holds %d bytes of noise, want at most %d", len(s.raw), maxNoise)
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
	// Lines without the prefix go.
	for range 64 {
		if err := s.feed(noise); err != nil {
			t.Fatal(err)
		}
	}
	if n := len(s.raw) + len(s.out); n > 0 {
		t.Errorf("scanner holds %d bytes after noise lines", n)
	}

	line := []byte(prefix + strings.Repeat("x", 1<<20-len(prefix)-1) + "\n")
	var err error
	for i := 0; i <= maxOutput>>20 && err == nil; i++ {
		err = s.feed(line)
	}
	if !errors.Is(err, errTooMuchOutput) {
		t.Errorf("after %d MiB of output: error %v, want errTooMuchOutput", maxOutput>>20+1, err)
	}

	// Nor one endless line.
	s = newScanner(testNonce)
	if err := s.feed([]byte(ready + begin + prefix)); err != nil {
		t.Fatal(err)
	}
	err = nil
	for i := 0; i <= maxOutput>>20 && err == nil; i++ {
		err = s.feed(line[:len(line)-1])
	}
	if !errors.Is(err, errTooMuchOutput) {
		t.Errorf("after a line of %d MiB: error %v, want errTooMuchOutput", maxOutput>>20+1, err)
	}
}

// FuzzScanner feeds the scanner arbitrary bytes, as a guest may print
// anything: it must not panic, nor depend on how the bytes are split into
// reads, and what it returns must be well-formed.
func FuzzScanner(f *testing.F) {
	f.Add([]byte(ready+begin+framed("out\n", 0, "noise")), uint16(7))
	f.Add([]byte(ready+begin+framed("", 255, "")), uint16(30))
	f.Add([]byte("ORRREADY-"+ready+"ORRBEGIN-ORRBEGIN-"+begin+prefix+"ORREND-"+prefix+end+"1\n"), uint16(40))
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
		if whole.code < 0 || whole.code > 255 || strings.Contains(whole.output, end) || strings.Contains(whole.output, "\r") {
			t.Fatalf("output %q, status %d", whole.output, whole.code)
		}
		clean := strings.ReplaceAll(string(data), "\r", "")
		if !strings.Contains(clean, strings.ReplaceAll(begin, "\r", "")) || !strings.Contains(clean, prefix) {
			t.Fatalf("output %q without markers in %q", whole.output, clean)
		}
	})
}

// FuzzScannerOutput frames arbitrary output as Run has the shell print it,
// among arbitrary noise before it and lines of noise between its lines:
// the scanner must return the output, without carriage returns, and the
// status.
func FuzzScannerOutput(f *testing.F) {
	f.Add([]byte("root@node:~# "), []byte("line 1\r\nline 2\r\n"), uint8(0), "[   29.7] systemd[1]: noise", []byte("root@node:~# "))
	f.Add([]byte(""), []byte(""), uint8(255), "", []byte(""))
	f.Add([]byte("ORRBEGIN-0123\r\n"), []byte("ORREND-"+testNonce), uint8(3), "ORRLINE-"+testNonce, []byte(end+"x"))
	f.Fuzz(func(t *testing.T, noise, output []byte, code uint8, noiseLine string, after []byte) {
		clean := func(b []byte) []byte { return bytes.ReplaceAll(b, []byte("\r"), nil) }
		noiseLine = strings.NewReplacer("\n", "", "\r", "").Replace(noiseLine)
		// Output holding the end marker, noise holding the begin marker,
		// or a noise line with the prefix cannot be told apart from the
		// real ones: Run's nonce is random and unknown to the guest
		// beforehand.
		if bytes.Contains(clean(noise), clean([]byte(begin))) || bytes.Contains(clean(output), []byte(end)) || strings.HasPrefix(noiseLine, prefix) {
			t.Skip()
		}
		printed := string(noise) + ready + string(noise) + begin + framed(string(output), int(code), noiseLine) + string(after)
		for _, size := range []int{0, 3} {
			got := scanAll([]byte(printed), size)
			if got.err != nil || !got.done || got.output != string(clean(output)) || got.code != int(code) {
				t.Fatalf("chunks of %d: %+v; want output %q, status %d", size, got, clean(output), code)
			}
		}
	})
}
