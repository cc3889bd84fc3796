package failurelog

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

const mirror = `Nov 26 13:58:03 localhost kubelet[407]: E1126 kubelet.go:3516] "Unable to register mirror pod because node is not registered yet" err="node \"cp-0\" not found"`

func TestJournalLeavesOutNoiseAndKeepsTheNewest(t *testing.T) {
	var raw strings.Builder
	for i := range 10 {
		fmt.Fprintf(&raw, "line %d\n%s\n", i, mirror)
	}
	for name, tc := range map[string]struct {
		lim        Limits
		want       []string
		wantHeader string
	}{
		"all fit":  {Limits{JournalLines: 100, JournalBytes: 1 << 20}, []string{"line 0", "line 9"}, "(0 older lines and 10 lines"},
		"by lines": {Limits{JournalLines: 3, JournalBytes: 1 << 20}, []string{"line 7", "line 8", "line 9"}, "(7 older lines and 10 lines"},
		// 13 bytes hold "line 8\nline 9"; the cut starts at a whole line.
		"by bytes": {Limits{JournalLines: 100, JournalBytes: 16}, []string{"line 8", "line 9"}, "(8 older lines and 10 lines"},
	} {
		t.Run(name, func(t *testing.T) {
			got := string(Journal([]byte(raw.String()), tc.lim))
			lines := strings.Split(strings.TrimSuffix(got, "\n"), "\n")
			if !strings.Contains(lines[0], tc.wantHeader) {
				t.Errorf("header %q, want it to say %q", lines[0], tc.wantHeader)
			}
			if strings.Contains(got, "not registered yet\" err") {
				t.Errorf("the noise is still there:\n%s", got)
			}
			body := lines[1:]
			if body[0] != tc.want[0] || body[len(body)-1] != tc.want[len(tc.want)-1] {
				t.Errorf("kept %q, want %q to %q", body, tc.want[0], tc.want[len(tc.want)-1])
			}
		})
	}
	if got := string(Journal(nil, DefaultLimits)); strings.Count(got, "\n") != 1 {
		t.Errorf("an empty journal gives %q, want the header alone", got)
	}
}

func TestContainerLogsTheCurrentAndPreviousInstances(t *testing.T) {
	dir := t.TempDir()
	write := func(rel, content string) {
		t.Helper()
		path := filepath.Join(dir, rel)
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	api := "kube-system_kube-apiserver-cp-0_54ac/kube-apiserver/"
	write(api+"0.log", "first instance\n")
	write(api+"1.log", "second instance: F hooks.go:203] PostStartHook failed\n")
	write(api+"2.log", "third instance\n"+strings.Repeat("x", 100)+"\nthe end\n")
	write("kube-system_etcd-cp-0_67c3/etcd/0.log", "etcd: slow fdatasync")
	write("kube-system_coredns-abc_11/coredns/0.log", "not a control-plane pod\n")
	write(api+"notes.txt", "not a log\n")

	got := string(ContainerLogs(dir, Limits{LogBytes: 64}))
	for _, want := range []string{
		"etcd: slow fdatasync\n",
		api + "1.log (all of it)",
		"PostStartHook failed",
		api + "2.log (its last",
		"the end\n",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("report lacks %q:\n%s", want, got)
		}
	}
	for _, unwanted := range []string{"first instance", "third instance", "coredns", "not a log"} {
		if strings.Contains(got, unwanted) {
			t.Errorf("report has %q:\n%s", unwanted, got)
		}
	}
	if etcd, api := strings.Index(got, "etcd/0.log"), strings.Index(got, "kube-apiserver/1.log"); etcd > api {
		t.Errorf("etcd's log comes after the API server's; the order of ControlPlane is the report's:\n%s", got)
	}
	if got := ContainerLogs(filepath.Join(dir, "absent"), DefaultLimits); len(got) != 0 {
		t.Errorf("no log directory gives %q, want nothing", got)
	}
}
