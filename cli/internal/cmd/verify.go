package cmd

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/spf13/cobra"

	"github.com/orrery-dev/orrery/internal/attestation"
	"github.com/orrery-dev/orrery/internal/nodelock"
	"github.com/orrery-dev/orrery/internal/owner"
	"github.com/orrery-dev/orrery/internal/owner/dialer"
	"github.com/orrery-dev/orrery/internal/owner/inspect"
	"github.com/orrery-dev/orrery/internal/proto/initpb"
	"github.com/orrery-dev/orrery/internal/proto/inspectpb"
	"github.com/orrery-dev/orrery/internal/termtext"
)

type verifyOptions struct {
	node    string
	cluster clusterOptions
	output  string
}

func newVerifyCmd() *cobra.Command {
	var o verifyOptions
	c := &cobra.Command{
		Use:   "verify [NODE...] | --node HOST[:PORT]",
		Short: "Check what nodes run: the cluster's running nodes, or a node before init",
		Long: fmt.Sprintf(`verify has nodes attest over attested TLS with a fresh nonce and checks
each quote against the image's expected measurements and the attestation
key against the platform CA. It changes nothing on a node.

Without --node, it checks your cluster's running nodes: those named (by
name, found through the kubeconfig or in 'orrery mini''s state when the
API server does not answer, or by address), or every node of the cluster.
Each must run one of the images whose measurements you pass (both images
during an upgrade) and be locked to your cluster (PCR 15 holds your
cluster ID, derived from the master secret); verify prints the image it
matched, its cluster ID and the instance its platform certified, or why
it was refused, and fails if any node was. It talks to each node's node
service (port %d), which answers only the holder of the master secret.

With --node, it checks a node that belongs to no cluster yet (port %d),
before you trust it with 'orrery init'. It also prints the instance (VM
name and ID) the platform certified in the attestation key's certificate:
the ID is what 'orrery control-plane approve' takes.`, inspectpb.Port, initpb.Port),
		Example: `  orrery verify                       # every node of the cluster
  orrery verify cp-0 worker-0 -o json
  orrery verify --measurements old/measurements.json --measurements build/image/measurements.json
  orrery verify --node 10.42.1.100 --measurements build/image/measurements.json \
    --platform-ca orrery-mini/platform-ca.crt`,
		RunE: func(cmd *cobra.Command, args []string) error {
			if o.node != "" {
				if len(args) > 0 {
					return errors.New("name nodes either with --node (a node before init) or as arguments (running nodes), not both")
				}
				return runVerifyNew(cmd.Context(), cmd, o)
			}
			return runVerifyCluster(cmd, o, args)
		},
	}
	f := c.Flags()
	f.StringVar(&o.node, "node", "", fmt.Sprintf("a node that belongs to no cluster yet, HOST or HOST:PORT (port defaults to %d)", initpb.Port))
	addOutputFlag(c, &o.output)
	describeOutput(c, []nodeVerdict{})
	addClusterFlags(f, &o.cluster, time.Minute)
	return c
}

// runVerifyNew checks a node before init, on the bootstrapper's port.
func runVerifyNew(ctx context.Context, cmd *cobra.Command, o verifyOptions) error {
	addr, err := dialer.ParseAddress(o.node, initpb.Port)
	if err != nil {
		return fmt.Errorf("--node: %w", err)
	}
	if err := o.cluster.check(nil); err != nil {
		return err
	}
	if err := checkOutput(o.output); err != nil {
		return err
	}
	images, err := o.cluster.images()
	if err != nil {
		return err
	}
	if len(images) != 1 {
		return errors.New("--node checks a node against one image: pass --measurements once")
	}
	cas, err := o.cluster.platformCAs()
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, o.cluster.timeout)
	defer cancel()
	res, err := owner.Verify(ctx, owner.VerifyConfig{
		Node: addr, Measurements: images[0].Policy, PlatformCAs: cas, Collateral: o.cluster.hardware.collateral(),
		TrustAnyAK: o.cluster.trustAnyAK, Logger: logger(cmd),
	})
	if err != nil {
		return err
	}
	if o.output != "text" {
		return writeData(cmd.OutOrStdout(), o.output, nodeVerdict{
			Address: addr, OK: true, Image: images[0].Name, Attestation: res.Variant.String(),
			Instance: res.Instance.Name, InstanceID: res.Instance.ID, Hardware: res.Hardware,
		})
	}
	fmt.Fprintf(cmd.OutOrStdout(), "OK: %s attested as %s; its PCRs match %s\n", addr, res.Variant, images[0].Name)
	// What an owner needs to approve the VM as a control plane
	// ('orrery control-plane approve'): only a certified instance, read
	// from an AK certificate that chained to the platform CA.
	if !res.Instance.IsZero() {
		fmt.Fprintf(cmd.OutOrStdout(), "Its platform certifies it as instance %q with instance ID %s\n", res.Instance.Name, res.Instance.ID)
	}
	writeHardware(cmd.OutOrStdout(), res.Hardware)
	return nil
}

// nodeVerdict is what verify found of one node. A node before init
// (--node) has no name, OS or cluster ID yet.
type nodeVerdict struct {
	Name        string              `json:"name"`
	Address     string              `json:"address"`
	OK          bool                `json:"ok"`
	Error       string              `json:"error,omitempty"`
	Image       string              `json:"image,omitempty"`
	OS          string              `json:"os,omitempty"`
	ClusterID   string              `json:"clusterID,omitempty"`
	Attestation string              `json:"attestation,omitempty"`
	Instance    string              `json:"instance,omitempty"`
	InstanceID  string              `json:"instanceID,omitempty"`
	Hardware    []attestation.Field `json:"hardware,omitempty"`
}

func runVerifyCluster(cmd *cobra.Command, o verifyOptions, names []string) error {
	if err := checkOutput(o.output); err != nil {
		return err
	}
	ctx := cmd.Context()
	own, err := o.cluster.owner(cmd, names)
	if err != nil {
		return err
	}
	ts, err := o.cluster.targets(ctx, cmd.ErrOrStderr(), names)
	if err != nil {
		return err
	}
	if len(ts) == 0 {
		return errors.New("the cluster lists no node: name the nodes by address")
	}
	var verdicts []nodeVerdict
	refused := 0
	for _, t := range ts {
		v := verifyNode(ctx, o.cluster, own, t)
		if !v.OK {
			refused++
		}
		verdicts = append(verdicts, v)
		if o.output == "text" {
			writeVerdict(cmd.OutOrStdout(), v)
		}
	}
	if o.output != "text" {
		if err := writeData(cmd.OutOrStdout(), o.output, verdicts); err != nil {
			return err
		}
	}
	if refused > 0 {
		return fmt.Errorf("%d of %d nodes did not pass", refused, len(ts))
	}
	return nil
}

func verifyNode(ctx context.Context, o clusterOptions, own inspect.Owner, t target) nodeVerdict {
	v := nodeVerdict{Name: t.label(), Address: t.Addr}
	n, err := o.dialNode(ctx, own, t)
	if err != nil {
		v.Error = err.Error()
		return v
	}
	defer n.Close()
	if !n.Locked {
		v.Error = fmt.Sprintf("it runs the image of %s but is locked to no cluster yet (PCR %d is zero): it waits in its initrd for its disk key (read why with 'orrery logs %s'; a control plane whose cluster is down needs 'orrery recover')",
			n.Image, nodelock.PCR, t.label())
		return v
	}
	v.OK, v.Image, v.OS, v.Attestation = true, n.Image, n.Status.GetImage(), n.Variant.String()
	v.ClusterID = hex.EncodeToString(own.ClusterID)
	v.Instance, v.InstanceID, v.Hardware = n.Instance.Name, n.Instance.ID, n.Hardware
	if t.Name == "" && n.Instance.Name != "" {
		v.Name = n.Instance.Name // named by address: the instance its platform certified
	}
	return v
}

// writeVerdict prints a node's verdict. Its error may quote the node, and
// its OS is the node's word: each stays on its line.
func writeVerdict(w io.Writer, v nodeVerdict) {
	l := termtext.Line
	if !v.OK {
		fmt.Fprintf(w, "%s (%s): REFUSED: %s\n", l(v.Name), v.Address, l(v.Error))
		return
	}
	fmt.Fprintf(w, "%s (%s): OK\n", l(v.Name), v.Address)
	fmt.Fprintf(w, "  image:        %s (%s)\n", l(v.Image), l(v.OS))
	fmt.Fprintf(w, "  cluster ID:   %s (PCR 15)\n", v.ClusterID)
	fmt.Fprintf(w, "  attestation:  %s", v.Attestation)
	if v.Instance != "" {
		fmt.Fprintf(w, ", instance %q (ID %s)", v.Instance, l(v.InstanceID))
	}
	fmt.Fprintln(w)
	writeHardware(w, v.Hardware)
}

// writeHardware prints a verified hardware report's fields, aligned.
func writeHardware(w io.Writer, fields []attestation.Field) {
	if len(fields) == 0 {
		return
	}
	fmt.Fprintln(w, "Its hardware report (verified):")
	width := 0
	for _, f := range fields {
		width = max(width, len(f.Name)+1)
	}
	for _, f := range fields {
		fmt.Fprintf(w, "  %-*s  %s\n", width, f.Name+":", termtext.Line(f.Value))
	}
}
