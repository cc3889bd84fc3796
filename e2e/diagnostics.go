//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/orrery-dev/orrery/internal/cloud"
)

// diagnostics is the folder a failed run leaves under build/, so that the
// next person sees why without running the suite again.
type diagnostics struct {
	dir string
}

// newDiagnostics names a fresh folder under root; nothing is written
// until the run fails.
func newDiagnostics(root string) *diagnostics {
	return &diagnostics{dir: filepath.Join(root, time.Now().UTC().Format("20060102T150405Z"))}
}

// write saves data as name in the folder, creating it on first use.
func (d *diagnostics) write(name string, data []byte) error {
	path := filepath.Join(d.dir, name)
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	return os.WriteFile(path, data, 0o644)
}

// clusterState saves what the API server says about the cluster, if it
// answers, most telling first, since a struggling API server may use up
// the time before the rest: the control-plane containers' logs and the
// control planes' journals (both come from kubelet, not from etcd, so they answer
// while etcd stalls), then nodes, pods with their restart counts and
// events, then every other kube-system container's logs. Previous
// instances' logs are kept where a container restarted. nodes and
// controlPlanes are the cloud's names, so nothing waits on a list call.
func (d *diagnostics) clusterState(k kubectlFunc, nodes, controlPlanes []string) []error {
	var errs []error
	save := func(name string, args ...string) string {
		out, err := k(args...)
		if err != nil {
			out = fmt.Sprintf("kubectl %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		if werr := d.write(name, []byte(out)); werr != nil {
			errs = append(errs, werr)
		}
		return out
	}
	podLogs := func(ns, pod string) {
		save("logs/"+ns+"/"+pod+".log", "-n", ns, "logs", pod, "--all-containers", "--timestamps")
		if prev, err := k("-n", ns, "logs", pod, "--all-containers", "--timestamps", "--previous"); err == nil {
			if werr := d.write("logs/"+ns+"/"+pod+".previous.log", []byte(prev)); werr != nil {
				errs = append(errs, werr)
			}
		}
	}
	done := map[string]bool{}
	for _, n := range controlPlanes {
		// kubeadm names its static pods <component>-<node>.
		for _, c := range []string{"etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler"} {
			podLogs("kube-system", c+"-"+n)
			done[c+"-"+n] = true
		}
	}
	// The nodes' journals: journald does not forward them to the serial
	// console, the owner reads them through kubelet's node log query.
	// The control planes' first; the other nodes' last, since a node
	// whose kubelet does not answer (the very failure, often) costs the
	// request timeout per unit, which used up the time for the pod
	// state and the join service's log in a failed rejoin.
	journals := func(nodes []string) {
		for _, n := range nodes {
			for _, unit := range journalUnits {
				save("nodes/"+n+"/journal-"+unit+".log", "get", "--raw", "/api/v1/nodes/"+n+"/proxy/logs/?query="+unit)
			}
		}
	}
	journals(controlPlanes)
	save("kubectl/nodes.txt", "get", "nodes", "-o", "wide")
	save("kubectl/pods.txt", "get", "pods", "-A", "-o", "wide")
	save("kubectl/events.txt", "get", "events", "-A", "--sort-by=.lastTimestamp")
	save("kubectl/restarts.txt", "get", "pods", "-A", "-o",
		"custom-columns=NAMESPACE:.metadata.namespace,POD:.metadata.name,CONTAINER:.status.containerStatuses[*].name,RESTARTS:.status.containerStatuses[*].restartCount,LAST-EXIT:.status.containerStatuses[*].lastState.terminated.reason")
	for _, n := range nodes {
		stats := save("nodes/"+n+"/stats-summary.json", "get", "--raw", "/api/v1/nodes/"+n+"/proxy/stats/summary")
		if table, err := cpuTable([]byte(stats)); err == nil {
			if werr := d.write("nodes/"+n+"/cpu.txt", []byte(table)); werr != nil {
				errs = append(errs, werr)
			}
		}
	}
	save("kubectl/describe-kube-system.txt", "-n", "kube-system", "describe", "pods")
	// The other kube-system pods, and the suite's own (the client pod's
	// output says which of DNS and the Service failed).
	for _, ns := range []string{"kube-system", "default"} {
		pods, err := k("-n", ns, "get", "pods", "-o", "jsonpath={range .items[*]}{.metadata.name}{\"\\n\"}{end}")
		if err != nil {
			return append(errs, fmt.Errorf("the API server does not answer, no pod logs: %v", err))
		}
		for _, pod := range strings.Fields(pods) {
			if !done[pod] {
				podLogs(ns, pod)
			}
		}
	}
	journals(slices.DeleteFunc(slices.Clone(nodes), func(n string) bool { return slices.Contains(controlPlanes, n) }))
	return errs
}

// journalUnits are the units whose journals a failed run keeps for each
// node the API server knows.
var journalUnits = []string{"bootstrapperd", "kubelet", "containerd", "orrery-images"}

// joinLog is where the HA suite keeps a joining control plane's
// bootstrapperd journal, in the node's folder.
const joinLog = "bootstrapperd-while-joining.log"

// nodeLogs copies each node's serial console (the boot, the initrd, the
// kernel's messages and bootstrapperd's log) and QEMU's log.
func (d *diagnostics) nodeLogs(nodes []*cloud.Node) []error {
	var errs []error
	for _, n := range nodes {
		for _, f := range []string{"serial.log", "qemu.log", joinLog} {
			raw, err := os.ReadFile(filepath.Join(n.Dir, f))
			if os.IsNotExist(err) {
				continue // a spare that never booted
			}
			if err == nil {
				err = d.write(filepath.Join("nodes", n.Name, f), raw)
			}
			if err != nil {
				errs = append(errs, err)
			}
		}
	}
	return errs
}

// ownerLogs copies what 'orrery init' saved about a failure on the node
// (never the master secret or the kubeconfig beside them).
func (d *diagnostics) ownerLogs(ownerDir string) []error {
	var errs []error
	logs, _ := filepath.Glob(filepath.Join(ownerDir, "orrery-init-*.log"))
	for _, path := range logs {
		raw, err := os.ReadFile(path)
		if err == nil {
			err = d.write(filepath.Join("owner", filepath.Base(path)), raw)
		}
		if err != nil {
			errs = append(errs, err)
		}
	}
	return errs
}

type kubectlFunc func(args ...string) (string, error)

// awaitAPIServer waits until the API server answers, for as long as ctx
// allows, and says how long that took. A run that failed because the API
// server restarted (under hack/stress-e2e.sh it refused connections for
// minutes after the control plane's recovery) finds it back a little later,
// and only then can the suite read why: the previous instance's log and the
// nodes' journals come through it.
func awaitAPIServer(ctx context.Context, k kubectlFunc) (time.Duration, error) {
	start := time.Now()
	for {
		out, err := k("get", "--raw", "/livez")
		if err == nil {
			return time.Since(start), nil
		}
		select {
		case <-ctx.Done():
			out = strings.TrimSpace(out)
			out = out[strings.LastIndexByte(out, '\n')+1:]
			return time.Since(start), fmt.Errorf("the API server did not answer within %s: %s", time.Since(start).Round(time.Second), out)
		case <-time.After(5 * time.Second):
		}
	}
}
