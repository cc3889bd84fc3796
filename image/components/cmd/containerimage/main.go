// Command containerimage builds a single-layer container image from files on the
// build host and writes it as an image archive that `ctr images import` and
// `docker load` both accept: an OCI image layout (oci-layout, index.json,
// blobs/) plus Docker's manifest.json, in one tar.
//
// The output is deterministic: entries are sorted, owned by root, and carry
// the time given by -created, so the same inputs give the same image digest.
//
//	containerimage -ref registry.k8s.io/pause:3.10.2 -out pause.tar \
//	    -add build/pause:/pause -entrypoint '["/pause"]'
//
// It prints one JSON object to stdout: the reference, the manifest digest and
// the archive's sha256.
package main

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"time"
)

func main() {
	if err := run(os.Args[1:], os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "containerimage:", err)
		os.Exit(1)
	}
}

// listFlag collects a flag that may be repeated.
type listFlag []string

func (l *listFlag) String() string     { return strings.Join(*l, ",") }
func (l *listFlag) Set(v string) error { *l = append(*l, v); return nil }

func run(args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("containerimage", flag.ContinueOnError)
	var (
		spec    Spec
		adds    listFlag
		links   listFlag
		envs    listFlag
		out     = fs.String("out", "", "archive to write (required)")
		created = fs.String("created", "1970-01-01T00:00:00Z", "creation time of the image and of every file in it (RFC 3339)")
		entry   = fs.String("entrypoint", "", `entrypoint as a JSON array, e.g. '["/pause"]'`)
		cmd     = fs.String("cmd", "", "default arguments as a JSON array")
	)
	fs.StringVar(&spec.Ref, "ref", "", "image reference, e.g. registry.k8s.io/pause:3.10.2 (required)")
	fs.StringVar(&spec.User, "user", "", "user the image runs as (empty: root)")
	fs.StringVar(&spec.WorkingDir, "workdir", "", "working directory")
	fs.Var(&adds, "add", "SRC:DST: copy a file (following symlinks) or a directory tree (keeping its symlinks) from the host to DST in the image; repeatable")
	fs.Var(&links, "link", "DST:TARGET: a symlink at DST pointing to TARGET; repeatable")
	fs.Var(&envs, "env", "KEY=VALUE in the image config; repeatable (default: a standard PATH)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *out == "" || spec.Ref == "" {
		return errors.New("-ref and -out are required")
	}
	t, err := time.Parse(time.RFC3339, *created)
	if err != nil {
		return fmt.Errorf("parse -created: %w", err)
	}
	spec.Created = t.UTC()
	for _, a := range adds {
		src, dst, ok := strings.Cut(a, ":")
		if !ok || src == "" || !strings.HasPrefix(dst, "/") {
			return fmt.Errorf("-add %q: want SRC:/absolute/DST", a)
		}
		spec.Adds = append(spec.Adds, Add{Src: src, Dst: dst})
	}
	for _, l := range links {
		dst, target, ok := strings.Cut(l, ":")
		if !ok || target == "" || !strings.HasPrefix(dst, "/") {
			return fmt.Errorf("-link %q: want /absolute/DST:TARGET", l)
		}
		spec.Links = append(spec.Links, Link{Dst: dst, Target: target})
	}
	spec.Env = envs
	if len(spec.Env) == 0 {
		spec.Env = []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}
	}
	if spec.Entrypoint, err = jsonList("-entrypoint", *entry); err != nil {
		return err
	}
	if spec.Cmd, err = jsonList("-cmd", *cmd); err != nil {
		return err
	}

	res, err := Build(spec, *out)
	if err != nil {
		return err
	}
	enc := json.NewEncoder(stdout)
	return enc.Encode(res)
}

func jsonList(name, v string) ([]string, error) {
	if v == "" {
		return nil, nil
	}
	var l []string
	if err := json.Unmarshal([]byte(v), &l); err != nil {
		return nil, fmt.Errorf("%s: want a JSON array of strings: %w", name, err)
	}
	return l, nil
}
