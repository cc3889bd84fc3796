// Package logging sets up the log of every Orrery program the same way,
// with one flag for its level: journald with a field per attribute for a
// daemon on a node, JSON on stderr where a log collector reads it (the join
// and key services in their pod), text on a terminal (the owner's CLI).
//
// A program's logger carries no component attribute; each part that logs
// for itself (the init server, the join server, ...) adds its own, so that
// every line names its component once.
package logging

import (
	"flag"
	"fmt"
	"io"
	"log/slog"
	"strings"

	"github.com/orrery-dev/orrery/internal/logging/journallog"
)

// Format is where and how a program logs.
type Format string

// The formats.
const (
	// Journal sends each record to journald (slog text on stderr where
	// journald does not run).
	Journal Format = "journal"
	JSON    Format = "json"
	Text    Format = "text"
)

// Level is a log level that is also a command-line flag value, for the
// standard flag package and for cobra's: debug, info, warn or error.
type Level struct{ slog.Level }

// Set implements flag.Value.
func (l *Level) Set(s string) error {
	var v slog.Level
	if err := v.UnmarshalText([]byte(s)); err != nil {
		return fmt.Errorf("unknown log level %q: use debug, info, warn or error", s)
	}
	l.Level = v
	return nil
}

// String implements flag.Value.
func (l *Level) String() string { return strings.ToLower(l.Level.String()) }

// Type implements pflag.Value.
func (l *Level) Type() string { return "level" }

// LevelUsage is the help text of a --log-level flag.
const LevelUsage = "least important messages to log: debug, info, warn or error"

// AddLevelFlag adds --log-level to fs, setting l.
func AddLevelFlag(fs *flag.FlagSet, l *Level) { fs.Var(l, "log-level", LevelUsage) }

// Config is a program's log.
type Config struct {
	// Program names the program: journald's SYSLOG_IDENTIFIER.
	Program string
	Format  Format
	Level   Level
	// Output receives JSON and text, and Journal's fallback.
	Output io.Writer
	// Console receives a copy of each journal entry (Journal only): see
	// journallog.Options.Console.
	Console io.Writer
}

// New returns the logger of c.
func New(c Config) *slog.Logger {
	opts := &slog.HandlerOptions{Level: c.Level.Level}
	switch c.Format {
	case Journal:
		return journallog.New(c.Program, journallog.Options{Fallback: c.Output, Console: c.Console, Level: c.Level.Level})
	case JSON:
		return slog.New(slog.NewJSONHandler(c.Output, opts))
	default:
		return slog.New(slog.NewTextHandler(c.Output, opts))
	}
}
