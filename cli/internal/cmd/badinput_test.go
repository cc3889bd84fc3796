package cmd

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"
)

// TestBadInputRefusedAtOnce runs each command with input that cannot work
// and checks that it says what is wrong and exits non-zero within a
// second: before any file is needed, any node dialled or any VM started.
// It runs in an empty directory, so no default file exists.
func TestBadInputRefusedAtOnce(t *testing.T) {
	t.Chdir(t.TempDir())
	tests := []struct {
		args []string
		want []string
	}{
		{[]string{"init", "--kubernetes-version", "banana"}, []string{"Kubernetes banana is not supported", "v1.36"}},
		{[]string{"init", "--cluster-name", "Bad_Name"}, []string{`cluster name "Bad_Name" is not a DNS label`}},
		{[]string{"init", "--service-cidr", "garbage"}, []string{`service CIDR "garbage" is not an IP range`}},
		{[]string{"init", "--service-cidr", "10.244.0.0/16"}, []string{"overlaps the pods' range"}},
		{[]string{"init", "--node", "10.42.1.100", "--service-cidr", "10.32.0.0/12"}, []string{"holds the node's address 10.42.1.100"}},
		{[]string{"init", "--api-server-san", "a b"}, []string{`"a b"`, "DNS name"}},
		{[]string{"init", "--node", "https://10.42.1.100"}, []string{"--node", `drop "https://"`}},
		{[]string{"init", "--node", "10.42.1.100:99999"}, []string{"1 to 65535"}},
		{[]string{"init", "--timeout", "-1s"}, []string{"--timeout -1s"}},
		{[]string{"init"}, []string{"no --node given", "orrery mini up"}},
		{[]string{"mini", "up", "--workers", "-5"}, []string{"--workers -5: want 0 to 50"}},
		{[]string{"mini", "up", "--control-planes", "0"}, []string{"--control-planes 0: want 1 to 50"}},
		{[]string{"mini", "up", "--memory", "10", "--cpus", "0"}, []string{"--memory 10: want 256", "--cpus 0: want 1 to 64"}},
		{[]string{"mini", "up", "--state-disk-size", "100"}, []string{"--state-disk-size 100: want 2048"}},
		{[]string{"verify", "--node", "[::1"}, []string{"--node", "IPv6 address with a port goes in brackets"}},
		{[]string{"verify", "--node", "10.42.1.100", "cp-0"}, []string{"not both"}},
		{[]string{"verify", "https://10.42.1.100"}, []string{`drop "https://"`}},
		{[]string{"verify", "Bad_Node"}, []string{`"Bad_Node" is neither a node's name`}},
		{[]string{"verify", "--timeout", "0s"}, []string{"--timeout 0s"}},
		{[]string{"verify", "-o", "xml"}, []string{"xml"}},
		{[]string{"logs", "ftp://cp-0"}, []string{`drop "ftp://"`}},
		{[]string{"logs"}, []string{"arg"}},
		{[]string{"services", "[10.0.0.1]"}, []string{"not an IPv6 address"}},
		{[]string{"dmesg", "cp-0:0"}, []string{"1 to 65535"}},
		{[]string{"top", "cp-0", "--interval", "10ms"}, []string{"--interval 10ms: at least 1s"}},
		{[]string{"top", "cp-0", "--rows", "-1"}, []string{"--rows -1: at least 1"}},
		{[]string{"top", "cp-0", "-o", "xml"}, []string{"xml"}},
		{[]string{"support", "10.0.0.1 9001"}, []string{"is neither a node's name"}},
		{[]string{"recover", "--node", "http://10.42.1.100"}, []string{`drop "http://"`}},
		{[]string{"recover"}, []string{"node"}},
		{[]string{"control-plane", "approve"}, []string{"arg"}},
		{[]string{"upgrade", "apply", "--kubernetes-version", "v1.99"}, []string{"--kubernetes-version", "v1.99 is not supported", "v1.37"}},
		{[]string{"upgrade", "apply", "--kubernetes-version", "v1.37", "--retire", "image-x"}, []string{"--retire is an option of the upgrade of Orrery's releases"}},
		{[]string{"upgrade", "apply", "--kubernetes-version", "v1.37"}, []string{"read the master secret"}},
		{[]string{"no-such-command"}, []string{"unknown command"}},
		{[]string{"init", "--no-such-flag"}, []string{"unknown flag"}},
	}
	for _, tt := range tests {
		name := strings.Join(tt.args, " ")
		t.Run(name, func(t *testing.T) {
			var out, errOut bytes.Buffer
			start := time.Now()
			code := Execute(context.Background(), tt.args, &out, &errOut)
			took := time.Since(start)
			if code == 0 {
				t.Fatalf("orrery %s: exit 0; want a refusal\nstdout: %s", name, out.String())
			}
			for _, want := range tt.want {
				if !strings.Contains(errOut.String(), want) {
					t.Errorf("orrery %s said %q; want it to say %q", name, errOut.String(), want)
				}
			}
			if took > time.Second {
				t.Errorf("orrery %s took %s to refuse; want under a second", name, took.Round(time.Millisecond))
			}
		})
	}
}
