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
	awaitReady  phase = iota // the shell has not answered yet
	awaitBegin               // the command line is typed, its output not begun
	awaitEnd                 // the output runs until the end marker
	awaitStatus              // the end marker is there, its exit status not complete
	complete
)

// scanner finds one command's output in the bytes a serial line prints,
// which come from the guest and are not trusted. It looks for three
// markers, in order, each with the call's nonce: ready (the shell answers),
// begin (the output starts after it) and end (the output ends before it,
// and the exit status follows it up to a newline). Everything before the
// begin marker is noise: prompts, the echo of what was typed (which never
// holds a marker as printed), kernel messages, earlier commands. Carriage
// returns are dropped, as a terminal's output has one before every newline.
type scanner struct {
	ready, begin, end []byte

	buf   []byte // what was printed, without carriage returns
	from  int    // buf[:from] holds none of the marker looked for now
	phase phase
	start int // the output is buf[start:stop]
	stop  int
	code  int // the exit status, once complete
}

func newScanner(nonce string) *scanner {
	return &scanner{
		ready: []byte(readyWord + "-" + nonce + "\n"),
		begin: []byte(beginWord + "-" + nonce + "\n"),
		end:   []byte(endWord + "-" + nonce + ":"),
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
			s.buf = append(s.buf, p...)
			break
		}
		s.buf = append(s.buf, p[:i]...)
		p = p[i+1:]
	}
	for {
		switch s.phase {
		case awaitReady, awaitBegin:
			marker := s.ready
			if s.phase == awaitBegin {
				marker = s.begin
			}
			i, ok := s.find(marker)
			if !ok {
				s.trimNoise()
				return nil
			}
			s.from = i + len(marker)
			if s.phase == awaitReady {
				s.phase = awaitBegin
				continue
			}
			s.start = s.from
			s.phase = awaitEnd
		case awaitEnd:
			i, ok := s.find(s.end)
			if !ok {
				if len(s.buf)-s.start > maxOutput {
					return errTooMuchOutput
				}
				return nil
			}
			s.stop = i
			s.from = i + len(s.end)
			s.phase = awaitStatus
		case awaitStatus:
			rest := s.buf[s.from:]
			nl := bytes.IndexByte(rest, '\n')
			if nl < 0 {
				if len(rest) > maxStatus {
					return fmt.Errorf("the end marker is followed by %q, not an exit status", rest)
				}
				return nil
			}
			code, err := parseStatus(rest[:nl])
			if err != nil {
				return err
			}
			s.code = code
			s.phase = complete
			return nil
		default:
			return nil
		}
	}
}

// find looks for marker in the bytes not searched yet; if it is not there,
// the next search starts where a marker split across reads might begin.
func (s *scanner) find(marker []byte) (int, bool) {
	if i := bytes.Index(s.buf[s.from:], marker); i >= 0 {
		return s.from + i, true
	}
	s.from = max(s.from, len(s.buf)-len(marker)+1)
	return 0, false
}

// trimNoise keeps the bytes before the output from growing without bound.
func (s *scanner) trimNoise() {
	if len(s.buf) <= maxNoise {
		return
	}
	drop := len(s.buf) - noiseKept
	s.buf = append(s.buf[:0], s.buf[drop:]...)
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

// output is the command's output: complete once done, else what it has
// printed so far.
func (s *scanner) output() string {
	switch s.phase {
	case awaitEnd:
		return string(s.buf[s.start:])
	case awaitStatus, complete:
		return string(s.buf[s.start:s.stop])
	}
	return ""
}

// noise is the end of what was printed before the command's output, for
// error messages.
func (s *scanner) noise(n int) string {
	b := s.buf
	if s.started() {
		b = b[:s.start]
	}
	if len(b) > n {
		b = b[len(b)-n:]
	}
	return string(b)
}
