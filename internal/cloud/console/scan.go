package console

import (
	"bytes"
	"fmt"
	"strconv"
)

// Limits on what a guest can make the scanner hold.
const (
	// maxOutput bounds one command's output.
	maxOutput = 16 << 20
	// maxNoise bounds the bytes kept from before the command's output;
	// only their last noiseKept matter, for error messages.
	maxNoise  = 64 << 10
	noiseKept = 4 << 10
	// maxStatus is the longest exit status: $? is 0 to 255.
	maxStatus = 3
)

// errTooMuchOutput is returned when a command prints more than maxOutput.
var errTooMuchOutput = fmt.Errorf("the command printed more than %d MiB: narrow it down (e.g. journalctl -n 1000)", maxOutput>>20)

type phase int

const (
	awaitReady phase = iota // the shell has not answered yet
	awaitBegin              // the command line is typed, its output not begun
	awaitEnd                // framed lines run until the end marker
	complete
)

// scanner finds one command's output in the bytes a serial line prints,
// which come from the guest and are not trusted. Each marker and the line
// prefix carry the call's nonce.
//
// First come two markers on lines of their own, in order: ready (the shell
// answers) and begin. Everything before begin is noise: prompts, the echo
// of what was typed (which never holds a marker as printed), kernel
// messages, earlier commands. After begin, each line of the command's
// output comes with the prefix; lines without it are dropped: what other
// programs print on the console meanwhile (journald forwards the journal
// there), or the shell's job notices. The prefixed lines, prefix removed,
// are the command's output followed by the end marker, its exit status
// and a newline. Carriage returns are dropped, as a terminal prints one
// before every newline.
type scanner struct {
	ready, begin, prefix, end []byte

	raw     []byte // what was printed, without carriage returns, not yet taken
	from    int    // raw[:from] holds none of the marker looked for now
	phase   phase
	out     []byte // what the prefixed lines hold
	outFrom int    // out[:outFrom] holds no end marker
	stop    int    // the output is out[:stop]
	code    int    // the exit status, once complete
}

func newScanner(nonce string) *scanner {
	return &scanner{
		ready:  []byte(readyWord + "-" + nonce + "\n"),
		begin:  []byte(beginWord + "-" + nonce + "\n"),
		prefix: []byte(lineWord + "-" + nonce + " "),
		end:    []byte(endWord + "-" + nonce + ":"),
	}
}

// feed takes the next bytes printed on the line. An error means the bytes
// cannot be a command's output as Run frames it; the scanner is then
// unusable.
func (s *scanner) feed(p []byte) error {
	if s.phase == complete {
		return nil // the next prompt, or whatever follows: not ours
	}
	for len(p) > 0 {
		i := bytes.IndexByte(p, '\r')
		if i < 0 {
			s.raw = append(s.raw, p...)
			break
		}
		s.raw = append(s.raw, p[:i]...)
		p = p[i+1:]
	}
	for s.phase < awaitEnd {
		marker := s.ready
		if s.phase == awaitBegin {
			marker = s.begin
		}
		i := bytes.Index(s.raw[s.from:], marker)
		if i < 0 {
			// The next search starts where a marker split across reads
			// might begin.
			s.from = max(s.from, len(s.raw)-len(marker)+1)
			s.trimNoise()
			return nil
		}
		s.from += i + len(marker)
		s.phase++
		if s.phase == awaitEnd {
			// Only the lines after begin count.
			s.raw = append(s.raw[:0], s.raw[s.from:]...)
			s.from = 0
		}
	}
	return s.takeLines()
}

// takeLines moves the content of complete prefixed lines to out and looks
// there for the end marker and the exit status.
func (s *scanner) takeLines() error {
	rest := s.raw
	for {
		nl := bytes.IndexByte(rest, '\n')
		if nl < 0 {
			break
		}
		// A prefixed line may sit inside another program's line: a
		// writer with a non-blocking descriptor (journald on the console,
		// this package's own tests) can have its line cut in two by a
		// full terminal buffer, and sed's whole line lands in the gap.
		// sed writes each line at once and blocks, so what follows the
		// prefix up to the newline is the command's line.
		if i := bytes.Index(rest[:nl+1], s.prefix); i >= 0 {
			s.out = append(s.out, rest[i+len(s.prefix):nl+1]...)
		}
		rest = rest[nl+1:]
	}
	s.raw = append(s.raw[:0], rest...)
	if len(s.out)+len(s.raw) > maxOutput {
		return errTooMuchOutput
	}
	i := bytes.Index(s.out[s.outFrom:], s.end)
	if i < 0 {
		s.outFrom = max(s.outFrom, len(s.out)-len(s.end)+1)
		return nil
	}
	s.stop = s.outFrom + i
	// Lines are whole: the status and its newline are there.
	status, _, _ := bytes.Cut(s.out[s.stop+len(s.end):], []byte("\n"))
	code, err := parseStatus(status)
	if err != nil {
		return err
	}
	s.code = code
	s.phase = complete
	return nil
}

// trimNoise keeps the bytes before the output from growing without bound.
func (s *scanner) trimNoise() {
	if len(s.raw) <= maxNoise {
		return
	}
	drop := len(s.raw) - noiseKept
	s.raw = append(s.raw[:0], s.raw[drop:]...)
	s.from = max(0, s.from-drop)
}

// parseStatus reads $? as a shell prints it: 0 to 255, no leading zeros.
func parseStatus(b []byte) (int, error) {
	if len(b) == 0 || len(b) > maxStatus || len(b) > 1 && b[0] == '0' {
		return 0, fmt.Errorf("the end marker is followed by %q, not an exit status", b)
	}
	for _, c := range b {
		if c < '0' || c > '9' {
			return 0, fmt.Errorf("the end marker is followed by %q, not an exit status", b)
		}
	}
	code, err := strconv.Atoi(string(b))
	if err != nil || code > 255 {
		return 0, fmt.Errorf("exit status %q out of range", b)
	}
	return code, nil
}

// answered tells whether the shell has printed the ready marker.
func (s *scanner) answered() bool { return s.phase > awaitReady }

// started tells whether the command's output has begun.
func (s *scanner) started() bool { return s.phase > awaitBegin }

// done tells whether the output and exit status are complete.
func (s *scanner) done() bool { return s.phase == complete }

// output is the command's output: complete once done, else the lines it
// has printed so far.
func (s *scanner) output() string {
	switch s.phase {
	case awaitEnd:
		return string(s.out)
	case complete:
		return string(s.out[:s.stop])
	}
	return ""
}

// noise is the end of what was printed before the command's output, for
// error messages.
func (s *scanner) noise(n int) string {
	if s.started() {
		return ""
	}
	b := s.raw
	if len(b) > n {
		b = b[len(b)-n:]
	}
	return string(b)
}
