package netenv

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os/exec"
	"strings"
)

// ipBinary is the iproute2 executable looked up in PATH.
const ipBinary = "ip"

// commander runs one ip(8) command and returns its standard output. It is
// the only way this package changes the network, so tests can record the
// commands without root.
type commander interface {
	run(ctx context.Context, args ...string) ([]byte, error)
}

// execIP runs the real ip binary.
type execIP struct{}

func (execIP) run(ctx context.Context, args ...string) ([]byte, error) {
	path, err := exec.LookPath(ipBinary)
	if err != nil {
		return nil, fmt.Errorf("ip not found in PATH: install iproute2 (Debian package iproute2): %w", err)
	}
	var stdout, stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, path, args...)
	cmd.Stdout = &stdout
	cmd.Stderr = &stderr
	if err := cmd.Run(); err != nil {
		// ip says what went wrong on stderr; the exit status alone does not.
		msg := strings.TrimSpace(stderr.String())
		if msg == "" {
			return nil, fmt.Errorf("ip %s: %w", strings.Join(args, " "), err)
		}
		return nil, fmt.Errorf("ip %s: %s: %w", strings.Join(args, " "), msg, err)
	}
	return stdout.Bytes(), nil
}

// ipTool wraps a commander with the few queries and changes this package
// needs, each in the namespace ns ("" is the caller's namespace).
type ipTool struct {
	cmd commander
}

// in prefixes args with -n ns when ns is set, so every command can run
// against a namespace without entering it.
func in(ns string, args ...string) []string {
	if ns == "" {
		return args
	}
	return append([]string{"-n", ns}, args...)
}

func (t ipTool) do(ctx context.Context, ns string, args ...string) error {
	_, err := t.cmd.run(ctx, in(ns, args...)...)
	return err
}

// link is the part of `ip -j -d link show` this package reads.
type link struct {
	Name     string `json:"ifname"`
	Master   string `json:"master"`
	LinkInfo struct {
		Kind string `json:"info_kind"`
		Data struct {
			Type string `json:"type"`
		} `json:"info_data"`
	} `json:"linkinfo"`
}

func (l link) isBridge() bool { return l.LinkInfo.Kind == "bridge" }

func (l link) isTap() bool { return l.LinkInfo.Kind == "tun" && l.LinkInfo.Data.Type == "tap" }

// links lists the links of namespace ns.
func (t ipTool) links(ctx context.Context, ns string) ([]link, error) {
	out, err := t.cmd.run(ctx, in(ns, "-j", "-d", "link", "show")...)
	if err != nil {
		return nil, err
	}
	var ls []link
	if err := decodeJSONList(out, &ls); err != nil {
		return nil, fmt.Errorf("parse ip link output: %w", err)
	}
	return ls, nil
}

// hasLink says whether namespace ns has a link called name.
func (t ipTool) hasLink(ctx context.Context, ns, name string) (bool, error) {
	ls, err := t.links(ctx, ns)
	if err != nil {
		return false, err
	}
	for _, l := range ls {
		if l.Name == name {
			return true, nil
		}
	}
	return false, nil
}

// namespaceExists tells whether ip knows a named network namespace.
func (t ipTool) namespaceExists(ctx context.Context, name string) (bool, error) {
	out, err := t.cmd.run(ctx, "-j", "netns", "list")
	if err != nil {
		return false, err
	}
	var nss []struct {
		Name string `json:"name"`
	}
	if err := decodeJSONList(out, &nss); err != nil {
		return false, fmt.Errorf("parse ip netns output: %w", err)
	}
	for _, ns := range nss {
		if ns.Name == name {
			return true, nil
		}
	}
	return false, nil
}

// decodeJSONList decodes a JSON array printed by ip -j. ip prints nothing
// at all instead of [] for some empty lists (netns list when no namespace
// was ever created), so empty output is an empty list.
func decodeJSONList(out []byte, v any) error {
	if len(bytes.TrimSpace(out)) == 0 {
		return nil
	}
	if err := json.Unmarshal(out, v); err != nil {
		return err
	}
	return nil
}

// errNotBridge refuses to delete a link that has the bridge's name but is
// something else: it was not made by us.
var errNotBridge = errors.New("is not a bridge")
