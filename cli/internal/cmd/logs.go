package cmd

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/spf13/cobra"

	"github.com/orrery-dev/orrery/internal/inspectserver"
	"github.com/orrery-dev/orrery/internal/owner/inspect"
	"github.com/orrery-dev/orrery/internal/proto/inspectpb"
	"github.com/orrery-dev/orrery/internal/termtext"
)

type logsOptions struct {
	cluster clusterOptions
	follow  bool
	boot    int
	since   string
	lines   uint32
	output  string
}

func newLogsCmd() *cobra.Command {
	var o logsOptions
	c := &cobra.Command{
		Use:   "logs NODE [UNIT]",
		Short: "Show a node's journal, of one unit or of all",
		Long: `logs reads a running node's journal from the node itself, over attested TLS:
the node proves it runs one of your images and is locked to your cluster,
and you prove the access key derived from your master secret. It works
while kubelet or the API server is down: NODE is a node's name (looked up
through the kubeconfig, or in 'orrery mini''s state when the API server does
not answer) or its address.

UNIT is a systemd unit ("kubelet" means kubelet.service). The node redacts
what looks like a secret (private keys, bootstrap tokens) before sending.`,
		Example: `  orrery logs cp-0 kubelet
  orrery logs worker-0 containerd --since 10m -f
  orrery logs 10.42.1.10 bootstrapperd --boot -1`,
		Args: cobra.RangeArgs(1, 2),
		RunE: func(cmd *cobra.Command, args []string) error {
			unit := ""
			if len(args) == 2 {
				unit = args[1]
			}
			return runJournal(cmd, o, args[0], &inspectpb.JournalRequest{Unit: unit})
		},
	}
	addJournalFlags(c, &o)
	return c
}

func addJournalFlags(c *cobra.Command, o *logsOptions) {
	f := c.Flags()
	f.BoolVarP(&o.follow, "follow", "f", false, "keep printing new entries until Ctrl-C")
	f.IntVar(&o.boot, "boot", 0, "which boot: 0 is this one, -1 the one before, and so on")
	f.StringVar(&o.since, "since", "", "only entries since this time: a duration back from now (10m, 2h) or RFC 3339 (2026-11-28T08:00:00Z)")
	f.Uint32VarP(&o.lines, "lines", "n", 0, fmt.Sprintf("how many of the newest entries (default %d, at most %d)", inspectserver.DefaultLines, inspectserver.MaxLines))
	f.StringVarP(&o.output, "output", "o", "text", "output format: text, or json (one entry per line)")
	addClusterFlags(f, &o.cluster, 2*time.Minute)
}

func runJournal(cmd *cobra.Command, o logsOptions, node string, req *inspectpb.JournalRequest) error {
	if o.output != "text" && o.output != "json" {
		return fmt.Errorf("--output %q: use text or json", o.output)
	}
	since, err := parseSince(o.since, time.Now())
	if err != nil {
		return err
	}
	req.Boot, req.Lines, req.Follow = int32(o.boot), o.lines, o.follow
	if !since.IsZero() {
		req.SinceUnixSeconds = since.Unix()
	}
	ctx := cmd.Context()
	n, err := dialOne(ctx, cmd, o.cluster, node)
	if err != nil {
		return err
	}
	defer n.Close()
	stream, err := n.Client.Journal(ctx, req)
	if err != nil {
		return termtext.Error(err)
	}
	return printEntries(cmd.OutOrStdout(), stream, o.output)
}

// dialOne resolves node and reaches it, verified.
func dialOne(ctx context.Context, cmd *cobra.Command, o clusterOptions, node string) (*inspect.Node, error) {
	owner, err := o.owner(cmd, []string{node})
	if err != nil {
		return nil, err
	}
	ts, err := o.targets(ctx, cmd.ErrOrStderr(), []string{node})
	if err != nil {
		return nil, err
	}
	return o.dialNode(ctx, owner, ts[0])
}

// printEntries prints each entry on one line: as text (FormatEntry
// escapes what the node wrote), or as JSON with what encoding/json leaves
// raw escaped too.
func printEntries(w io.Writer, stream inspectpb.InspectService_JournalClient, output string) error {
	for {
		batch, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			if stream.Context().Err() != nil {
				return nil // Ctrl-C while following
			}
			return termtext.Error(err)
		}
		for _, e := range batch.GetEntries() {
			if output == "json" {
				line, err := json.Marshal(jsonEntry(e))
				if err != nil {
					return err
				}
				if _, err := w.Write(append(termtext.JSON(line), '\n')); err != nil {
					return err
				}
				continue
			}
			if _, err := fmt.Fprintln(w, inspectserver.FormatEntry(e)); err != nil {
				return err
			}
		}
	}
}

// jsonEntry is an entry with its time readable.
func jsonEntry(e *inspectpb.JournalEntry) map[string]any {
	return map[string]any{
		"time": time.UnixMicro(e.GetTimeUnixMicros()).UTC().Format(time.RFC3339Nano), "unit": e.GetUnit(),
		"identifier": e.GetIdentifier(), "pid": e.GetPid(), "priority": e.GetPriority(), "message": e.GetMessage(),
	}
}

// parseSince reads --since: a duration back from now, or a time.
func parseSince(s string, now time.Time) (time.Time, error) {
	if s == "" {
		return time.Time{}, nil
	}
	if d, err := time.ParseDuration(s); err == nil && d > 0 {
		return now.Add(-d), nil
	}
	if t, err := time.Parse(time.RFC3339, s); err == nil {
		return t, nil
	}
	return time.Time{}, fmt.Errorf("--since %q: give a duration back from now (10m, 2h) or a time in RFC 3339 (2026-11-28T08:00:00Z)", s)
}
