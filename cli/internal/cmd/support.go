package cmd

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/orrery-dev/orrery/internal/atomicfile"
	"github.com/orrery-dev/orrery/internal/keys"
	"github.com/orrery-dev/orrery/internal/owner/inspect"
	"github.com/orrery-dev/orrery/internal/owner/nodeaddr"
	"github.com/orrery-dev/orrery/internal/owner/workspace"
	"github.com/orrery-dev/orrery/internal/redact"
)

type supportOptions struct {
	cluster clusterOptions
	out     string
}

func newSupportCmd() *cobra.Command {
	var o supportOptions
	c := &cobra.Command{
		Use:   "support [NODE...]",
		Short: "Collect a support bundle: every node's journal, units and kernel log, and the cluster's state",
		Long: `support writes a gzip-compressed tar archive for troubleshooting, and says
where:

  nodes/NAME/      each node's status, units, journal of this boot and of
                   the one before, and kernel log, read from the node
                   itself over attested TLS (see 'orrery logs'), so it works
                   while kubelet or the API server is down;
  cluster/         the cluster's nodes, pods and events, if the API server
                   answers;
  owner/           your last 'orrery init' failure logs and 'orrery upgrade
                   apply' output, from beside the master secret.

Nothing secret goes in: the nodes serve no key or token, and what looks
like one in a log (a private key, a bootstrap token) is replaced by
[REDACTED], on the node and again here. A node that cannot be reached gets
a file saying why, and the rest is still collected.`,
		Example: `  orrery support
  orrery support --file /tmp/cluster.tar.gz worker-0`,
		RunE: func(cmd *cobra.Command, args []string) error {
			return runSupport(cmd, o, args)
		},
	}
	// -o is the output format everywhere else; the archive is a file.
	c.Flags().StringVar(&o.out, "file", "", "the archive to write (default: orrery-support-TIME.tar.gz in the current directory)")
	addClusterFlags(c.Flags(), &o.cluster, 5*time.Minute)
	return c
}

func runSupport(cmd *cobra.Command, o supportOptions, names []string) error {
	ctx := cmd.Context()
	out := o.out
	if out == "" {
		out = "orrery-support-" + time.Now().UTC().Format("20060102T150405Z") + ".tar.gz"
	}
	own, err := o.cluster.owner(cmd, names)
	if err != nil {
		return err
	}
	ts, err := o.cluster.targets(ctx, cmd.ErrOrStderr(), names)
	if err != nil {
		return err
	}
	var archive bytes.Buffer
	b := inspect.NewBundle(&archive)
	progress := cmd.ErrOrStderr()
	for i, t := range ts {
		start := time.Now()
		fmt.Fprintf(progress, "[%d/%d] %s: ", i+1, len(ts), t.label())
		if err := addNode(ctx, b, o.cluster, own, t); err != nil {
			fmt.Fprintf(progress, "%v\n", err)
			if err := b.Add("nodes/"+dirName(t)+"/ERROR.txt", []byte(err.Error()+"\n")); err != nil {
				return err
			}
			continue
		}
		fmt.Fprintf(progress, "collected in %s\n", time.Since(start).Round(100*time.Millisecond))
	}
	fmt.Fprint(progress, "cluster: ")
	for name, data := range clusterState(ctx, o.cluster.kc, o.cluster.ws) {
		if err := b.Add("cluster/"+name, []byte(redact.Secrets(string(data)))); err != nil {
			return err
		}
	}
	fmt.Fprintln(progress, "collected")
	// The owner's logs: plain files only (a link planted under a log's
	// name could point at the master secret), and nothing that holds
	// the master secret goes in whatever it is called.
	ms, _ := keys.ReadMasterSecretFile(o.cluster.masterSecretPath)
	for _, name := range []string{workspace.JournalFile, workspace.KubeadmLogFile, workspace.UpgradeLogFile} {
		data, err := o.cluster.ws.ReadFile(name)
		switch {
		case errors.Is(err, fs.ErrNotExist):
			continue
		case err != nil:
			fmt.Fprintf(progress, "owner's %s left out: %v\n", name, err)
			continue
		case holdsSecret(data, ms):
			fmt.Fprintf(progress, "owner's %s left out: it holds the master secret\n", name)
			continue
		}
		if err := b.Add("owner/"+name, []byte(redact.Secrets(string(data)))); err != nil {
			return err
		}
	}
	if err := b.Close(); err != nil {
		return err
	}
	if err := atomicfile.WriteFile(out, archive.Bytes(), 0o600); err != nil {
		return fmt.Errorf("write %s: %w", out, err)
	}
	fmt.Fprintf(cmd.OutOrStdout(), "Wrote %s (%d KiB)\n", out, archive.Len()>>10)
	return nil
}

func addNode(ctx context.Context, b *inspect.Bundle, o clusterOptions, own inspect.Owner, t target) error {
	n, err := o.dialNode(ctx, own, t)
	if err != nil {
		return err
	}
	defer n.Close()
	ctx, cancel := context.WithTimeout(ctx, o.timeout)
	defer cancel()
	return b.AddNode(ctx, "nodes/"+dirName(t), n)
}

// dirName is a node's directory in the bundle.
func dirName(t target) string {
	return strings.NewReplacer("/", "_", ":", "_").Replace(t.label())
}

// clusterState is the cluster's nodes, pods and events as text, or a
// file that says why the API server could not tell.
func clusterState(ctx context.Context, kc kubeconfigOptions, ws workspace.Dir) map[string][]byte {
	fail := func(err error) map[string][]byte {
		return map[string][]byte{"ERROR.txt": []byte("the API server could not be read: " + err.Error() + "\n")}
	}
	rc, err := kc.restConfig(ws)
	if err != nil {
		return fail(err)
	}
	rc.Timeout = apiServerWait
	client, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return fail(err)
	}
	ctx, cancel := context.WithTimeout(ctx, 3*apiServerWait)
	defer cancel()
	files := map[string][]byte{}
	nodes, err := client.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		return fail(err)
	}
	files["nodes.txt"] = table(func(w io.Writer) {
		fmt.Fprintln(w, "NAME\tREADY\tVERSION\tINTERNAL-IP\tCONDITIONS")
		for _, n := range nodes.Items {
			var conds []string
			ready := "Unknown"
			for _, c := range n.Status.Conditions {
				conds = append(conds, fmt.Sprintf("%s=%s", c.Type, c.Status))
				if c.Type == corev1.NodeReady {
					ready = string(c.Status)
				}
			}
			fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\n", n.Name, ready, n.Status.NodeInfo.KubeletVersion, nodeaddr.InternalIP(n), strings.Join(conds, ","))
		}
	})
	if pods, err := client.CoreV1().Pods("").List(ctx, metav1.ListOptions{}); err == nil {
		files["pods.txt"] = table(func(w io.Writer) {
			fmt.Fprintln(w, "NAMESPACE\tNAME\tPHASE\tRESTARTS\tNODE\tREASON")
			for _, p := range pods.Items {
				restarts := int32(0)
				for _, c := range p.Status.ContainerStatuses {
					restarts += c.RestartCount
				}
				fmt.Fprintf(w, "%s\t%s\t%s\t%d\t%s\t%s\n", p.Namespace, p.Name, p.Status.Phase, restarts, p.Spec.NodeName, p.Status.Reason)
			}
		})
	}
	if events, err := client.CoreV1().Events("").List(ctx, metav1.ListOptions{}); err == nil {
		items := events.Items
		slices.SortFunc(items, func(a, b corev1.Event) int { return a.LastTimestamp.Compare(b.LastTimestamp.Time) })
		files["events.txt"] = table(func(w io.Writer) {
			fmt.Fprintln(w, "LAST SEEN\tTYPE\tREASON\tOBJECT\tCOUNT\tMESSAGE")
			for _, e := range items {
				fmt.Fprintf(w, "%s\t%s\t%s\t%s/%s/%s\t%d\t%s\n", e.LastTimestamp.UTC().Format(time.RFC3339), e.Type, e.Reason,
					e.InvolvedObject.Kind, e.InvolvedObject.Namespace, e.InvolvedObject.Name, e.Count, e.Message)
			}
		})
	}
	return files
}

func table(write func(io.Writer)) []byte {
	var b bytes.Buffer
	tw := tabwriter.NewWriter(&b, 0, 0, 2, ' ', 0)
	write(tw)
	tw.Flush()
	return b.Bytes()
}

// holdsSecret reports whether data holds ms's key, raw or as the master
// secret file writes it (base64) or in hex.
func holdsSecret(data []byte, ms keys.MasterSecret) bool {
	if len(ms.Key) == 0 {
		return false
	}
	for _, form := range [][]byte{ms.Key, []byte(base64.StdEncoding.EncodeToString(ms.Key)), []byte(hex.EncodeToString(ms.Key))} {
		if bytes.Contains(data, form) {
			return true
		}
	}
	return false
}
