package inspectserver

import (
	"context"
	"crypto/ed25519"
	"fmt"
	"io"
	"strconv"
	"testing"
	"time"

	"github.com/orrery-dev/orrery/internal/inspectserver/journaltest"
	"github.com/orrery-dev/orrery/internal/proto/inspectpb"
)

// nodeLikeJournal writes n entries with the fields journald gives a
// service's line (a node's journal is mostly kubelet's and containerd's):
// the support bundle's cost is journalctl writing and the server parsing
// every one of them.
func nodeLikeJournal(b *testing.B, n int) string {
	b.Helper()
	dir := b.TempDir()
	start := time.Now().Add(-time.Hour)
	es := make([]journaltest.Entry, n)
	for i := range es {
		es[i] = journaltest.Entry{
			Time: start.Add(time.Duration(i) * time.Millisecond), BootID: newBoot,
			Message: fmt.Sprintf(`I1201 01:02:03.%06d    1042 kubelet.go:2479] "SyncLoop (PLEG): event for pod" pod="kube-system/kube-proxy-%d" event={"ID":"0c5f","Type":"ContainerStarted"}`, i, i%17),
			Fields: map[string]string{
				"_SYSTEMD_UNIT": "kubelet.service", "SYSLOG_IDENTIFIER": "kubelet", "_PID": "1042", "PRIORITY": "6",
				"_TRANSPORT": "stdout", "_UID": "0", "_GID": "0", "_COMM": "kubelet", "_EXE": "/usr/bin/kubelet",
				"_CMDLINE":       "/usr/bin/kubelet --bootstrap-kubeconfig=/etc/kubernetes/bootstrap-kubelet.conf --kubeconfig=/etc/kubernetes/kubelet.conf --config=/var/lib/kubelet/config.yaml",
				"_CAP_EFFECTIVE": "1ffffffffff", "_SYSTEMD_CGROUP": "/system.slice/kubelet.service", "_SYSTEMD_SLICE": "system.slice",
				"_SYSTEMD_INVOCATION_ID": "5f0c3c1b8e9a4d0fa1b2c3d4e5f60718", "_MACHINE_ID": "0f1e2d3c4b5a69788796a5b4c3d2e1f0",
				"_HOSTNAME": "worker-0", "SYSLOG_FACILITY": "3", "_STREAM_ID": "a1b2c3d4e5f60718293a4b5c6d7e8f90",
				"_RUNTIME_SCOPE": "system", "_SOURCE_REALTIME_TIMESTAMP": strconv.FormatInt(start.UnixMicro(), 10),
			},
		}
	}
	journaltest.Write(b, dir, es)
	return dir
}

// BenchmarkSupportBundle is a node's support bundle from a journal of
// 20,000 entries, the journal part of what 'orrery support' waits for.
func BenchmarkSupportBundle(b *testing.B) {
	const entries = 20000
	srv, err := New(Config{
		Owner:   func() (ed25519.PublicKey, error) { return nil, nil },
		Journal: Journalctl{Dir: nodeLikeJournal(b, entries)},
		Units:   fakeUnits{},
		Status:  func() *inspectpb.StatusResponse { return &inspectpb.StatusResponse{} },
	})
	if err != nil {
		b.Fatal(err)
	}
	for b.Loop() {
		if err := srv.writeBundle(context.Background(), io.Discard); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/entries, "ns/entry")
}
