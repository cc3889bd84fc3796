package inspectserver

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/orrery-dev/orrery/internal/proto/inspectpb"
	"github.com/orrery-dev/orrery/internal/redact"
)

// Bounds of one Journal call. A node's journal holds hundreds of megabytes;
// an owner who wants all of it asks for a support bundle.
const (
	// DefaultLines is how many of the newest entries a request without a
	// count gets, as many as fill two screens.
	DefaultLines = 200
	// MaxLines caps a request's count: enough for a whole boot of a
	// quiet node, a few megabytes on the wire.
	MaxLines = 20000
	// MaxMessageBytes cuts a single entry's text: a pod that prints a
	// megabyte line should not make every reader pay for it.
	MaxMessageBytes = 4 << 10
	// maxRecordBytes is the longest JSON line from journalctl that is
	// parsed; longer ones are skipped.
	maxRecordBytes = 256 << 10
	// batchSize entries go in one message of the stream.
	batchSize = 100
	// followFlush sends a partial batch while following, so a new entry
	// reaches the owner within this time.
	followFlush = 200 * time.Millisecond
)

// Query is what a Journal request asks for, checked.
type Query struct {
	Unit   string
	Boot   int
	Since  time.Time
	Lines  int
	Follow bool
	Kernel bool
}

// unitName is what systemd accepts in a unit name: letters, digits and
// ":-_.\@", up to 255 bytes.
var unitName = regexp.MustCompile(`^[A-Za-z0-9:_.\\@-]{1,255}$`)

// QueryOf checks a request and fills in its defaults.
func QueryOf(req *inspectpb.JournalRequest) (Query, error) {
	q := Query{Unit: req.GetUnit(), Boot: int(req.GetBoot()), Lines: int(req.GetLines()), Follow: req.GetFollow(), Kernel: req.GetKernel()}
	if q.Unit != "" {
		if !unitName.MatchString(q.Unit) || strings.HasPrefix(q.Unit, "-") {
			return Query{}, fmt.Errorf("%q is not a systemd unit name: letters, digits and \":-_.\\@\" only", truncate(q.Unit, 64))
		}
		if q.Kernel {
			return Query{}, errors.New("ask for the kernel's messages or for a unit's, not both")
		}
		if !strings.Contains(q.Unit, ".") {
			q.Unit += ".service"
		}
	}
	if q.Boot > 0 {
		return Query{}, fmt.Errorf("boot %d is in the future: 0 is this boot, -1 the one before", q.Boot)
	}
	if q.Follow && q.Boot != 0 {
		return Query{}, errors.New("only this boot's journal can be followed")
	}
	if s := req.GetSinceUnixSeconds(); s != 0 {
		q.Since = time.Unix(s, 0)
	}
	switch {
	case q.Lines == 0:
		q.Lines = DefaultLines
	case q.Lines > MaxLines:
		return Query{}, fmt.Errorf("%d lines asked for, at most %d are served; for the whole journal, take a support bundle ('orrery support')", q.Lines, MaxLines)
	}
	return q, nil
}

// Journalctl reads the journal by running journalctl, which knows every
// journal format version; the node's own binary is the one that matches
// its journald.
// entryFields are the fields parseEntry reads, besides
// __REALTIME_TIMESTAMP, which journalctl's JSON always has. Asking for
// them alone keeps journalctl from writing, and the server from parsing,
// the twenty-odd fields journald adds to each entry.
const entryFields = "MESSAGE,PRIORITY,SYSLOG_IDENTIFIER,_PID,_SYSTEMD_UNIT,UNIT"

type Journalctl struct {
	// Path is the journalctl binary; empty means "journalctl" on PATH.
	Path string
	// Dir, if set, reads the journal files in this directory instead of
	// the system's (tests, and the initrd's journal).
	Dir string
}

func (j Journalctl) args(q Query) []string {
	// --all: without it, journalctl writes null for a field over 4 KiB.
	a := []string{"--output=json", "--output-fields=" + entryFields, "--all", "--no-pager", "--quiet", "--lines=" + strconv.Itoa(q.Lines)}
	if j.Dir != "" {
		a = append(a, "--directory="+j.Dir)
	}
	// journalctl counts boots back from the newest with -N.
	a = append(a, "--boot="+strconv.Itoa(q.Boot))
	if q.Unit != "" {
		a = append(a, "--unit="+q.Unit)
	}
	if q.Kernel {
		a = append(a, "--dmesg")
	}
	if !q.Since.IsZero() {
		a = append(a, "--since=@"+strconv.FormatInt(q.Since.Unix(), 10))
	}
	if q.Follow {
		a = append(a, "--follow")
	}
	return a
}

// Read runs journalctl for q and hands its entries to emit in batches,
// oldest first, until the journal ends (or, when following, ctx ends).
func (j Journalctl) Read(ctx context.Context, q Query, emit func([]*inspectpb.JournalEntry) error) error {
	path := j.Path
	if path == "" {
		path = "journalctl"
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	cmd := exec.CommandContext(ctx, path, j.args(q)...)
	var stderr bytes.Buffer
	cmd.Stderr = &limitedWriter{w: &stderr, n: 4 << 10}
	out, err := cmd.StdoutPipe()
	if err != nil {
		return err
	}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("run journalctl: %w", err)
	}
	readErr := readEntries(ctx, out, q.Follow, emit)
	if readErr != nil {
		cancel()
	}
	waitErr := cmd.Wait()
	switch {
	case readErr != nil:
		return readErr
	case ctx.Err() != nil:
		return ctx.Err()
	case waitErr != nil:
		return fmt.Errorf("journalctl failed: %v: %s", waitErr, strings.TrimSpace(stderr.String()))
	}
	return nil
}

// readEntries parses journalctl's JSON lines from r and emits them in
// batches; while following, a partial batch goes out after followFlush.
func readEntries(ctx context.Context, r io.Reader, follow bool, emit func([]*inspectpb.JournalEntry) error) error {
	lines := make(chan []byte)
	scanErr := make(chan error, 1)
	go func() {
		defer close(lines)
		br := bufio.NewReaderSize(r, 64<<10)
		for {
			line, err := readLine(br, maxRecordBytes)
			if err != nil {
				if errors.Is(err, io.EOF) {
					err = nil
				}
				scanErr <- err
				return
			}
			if line == nil {
				continue
			}
			select {
			case lines <- line:
			case <-ctx.Done():
				scanErr <- nil
				return
			}
		}
	}()
	// Each process's entries are redacted in their order, so that a key it
	// printed a line at a time goes whole; the window may start inside it.
	var writers redact.Writers
	var batch []*inspectpb.JournalEntry
	flush := func() error {
		if len(batch) == 0 {
			return nil
		}
		err := emit(batch)
		batch = nil
		return err
	}
	tick := time.NewTicker(followFlush)
	defer tick.Stop()
	for {
		select {
		case line, ok := <-lines:
			if !ok {
				if err := <-scanErr; err != nil {
					return fmt.Errorf("read journalctl's output: %w", err)
				}
				return flush()
			}
			e, err := parseEntry(line, &writers)
			if err != nil {
				continue
			}
			batch = append(batch, e)
			if len(batch) >= batchSize {
				if err := flush(); err != nil {
					return err
				}
			}
		case <-tick.C:
			if follow {
				if err := flush(); err != nil {
					return err
				}
			}
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// readLine reads the next line of br without its newline. A line longer
// than max is read to its end and dropped: it comes back as nil.
func readLine(br *bufio.Reader, max int) ([]byte, error) {
	var line []byte
	tooLong := false
	for {
		part, err := br.ReadSlice('\n')
		if !tooLong {
			if len(line)+len(part) > max+1 {
				tooLong, line = true, nil
			} else {
				line = append(line, part...)
			}
		}
		switch {
		case errors.Is(err, bufio.ErrBufferFull):
			continue
		case err != nil && (err != io.EOF || len(line) == 0 && !tooLong):
			return nil, err
		}
		if tooLong {
			return nil, nil
		}
		return bytes.TrimSuffix(line, []byte("\n")), nil
	}
}

// writerOf names the process that wrote e: its lines are redacted as one
// text.
func writerOf(e *inspectpb.JournalEntry) string {
	return strconv.Itoa(int(e.GetPid())) + "/" + e.GetIdentifier()
}

// parseEntry reads one record of `journalctl --output=json`: only the
// fields the owner is shown, the message redacted as the next line of its
// process (w) and cut.
func parseEntry(line []byte, w *redact.Writers) (*inspectpb.JournalEntry, error) {
	var rec map[string]json.RawMessage
	if err := json.Unmarshal(line, &rec); err != nil {
		return nil, fmt.Errorf("journal record: %w", err)
	}
	ts, err := strconv.ParseInt(field(rec, "__REALTIME_TIMESTAMP"), 10, 64)
	if err != nil {
		return nil, errors.New("journal record without a valid __REALTIME_TIMESTAMP")
	}
	unit := field(rec, "_SYSTEMD_UNIT")
	if unit == "" {
		unit = field(rec, "UNIT")
	}
	pid, _ := strconv.ParseInt(field(rec, "_PID"), 10, 32)
	prio, err := strconv.ParseInt(field(rec, "PRIORITY"), 10, 32)
	if err != nil || prio < 0 || prio > 7 {
		prio = 6
	}
	e := &inspectpb.JournalEntry{
		TimeUnixMicros: ts,
		Unit:           truncate(unit, 256),
		Identifier:     truncate(field(rec, "SYSLOG_IDENTIFIER"), 256),
		Pid:            int32(pid),
		Priority:       int32(prio),
	}
	e.Message = truncate(w.Line(writerOf(e), field(rec, "MESSAGE")), MaxMessageBytes)
	return e, nil
}

// field reads a journal field, which journalctl writes as a string, as an
// array of bytes (for a value that is not valid UTF-8), or as an array of
// either (a field set more than once; the first counts).
func field(rec map[string]json.RawMessage, name string) string {
	raw, ok := rec[name]
	if !ok {
		return ""
	}
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s
	}
	var b []byte
	var ints []int
	if json.Unmarshal(raw, &ints) == nil {
		for _, i := range ints {
			if i < 0 || i > 255 {
				return ""
			}
			b = append(b, byte(i))
		}
		return strings.ToValidUTF8(string(b), "\uFFFD")
	}
	var many []json.RawMessage
	if json.Unmarshal(raw, &many) == nil && len(many) > 0 {
		return field(map[string]json.RawMessage{name: many[0]}, name)
	}
	return ""
}

// truncate cuts s to at most n bytes, on a rune boundary.
func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	cut := n
	for cut > 0 && !utf8Start(s[cut]) {
		cut--
	}
	return s[:cut] + "…"
}

func utf8Start(b byte) bool { return b&0xC0 != 0x80 }

// limitedWriter keeps the first n bytes written to it.
type limitedWriter struct {
	w io.Writer
	n int
}

func (l *limitedWriter) Write(p []byte) (int, error) {
	if l.n > 0 {
		k := min(len(p), l.n)
		_, _ = l.w.Write(p[:k])
		l.n -= k
	}
	return len(p), nil
}
