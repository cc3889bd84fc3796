package cloud

import (
	"fmt"
	"os"
	"strconv"

	"github.com/orrery-dev/orrery/internal/cloud/vm"
	"github.com/orrery-dev/orrery/internal/role"
)

// CPU niceness of the VMs' QEMU under TCG, where an emulated vCPU wants a
// whole host core and a control plane is never idle: it needs about 1.5
// host cores doing nothing but keeping itself alive (its leases, probes
// and watches; measured on a 2-core host, issue 10).
//
// A control plane runs above the host's default priority. Beside one busy
// process at the same niceness (a build, a browser; hack/stress-e2e.sh)
// its two vCPU threads got 1.1 host cores: its backlog never drained,
// kubeadm ran out of time in two of four tries and, once a worker joined,
// the API server stopped answering and the nodes went NotReady. At -5 each
// vCPU thread weighs three times a default process, so the control plane
// gets the 1.5 cores it needs while the other process keeps the rest: a
// loaded host slows the cluster down instead of breaking it, and the
// user's work pays for it.
//
// A worker runs at the default priority, which keeps the control plane's
// three-to-one share over a booting worker: with equal shares a booting
// worker took half of the control plane's CPU, etcd timed out and the API
// server was killed by its liveness probe. Not more than three to one: at
// a ratio of nine a worker took 15 minutes to boot and join.
//
// Under KVM, VMs run at the host's speed and keep the default.
const (
	TCGControlPlaneNice = -5
	TCGWorkerNice       = 0
)

// defaultNice is the niceness n's VM runs at unless told otherwise.
func (c *Cloud) defaultNice(n *Node) int {
	if c.accel != vm.AccelTCG {
		return 0
	}
	if n.Role == role.ControlPlane {
		return TCGControlPlaneNice
	}
	return TCGWorkerNice
}

// niceWrap is the command prefix that runs QEMU at niceness nice relative
// to this process. Without the right to raise priority (CAP_SYS_NICE),
// nice(1) says so in QEMU's log and runs it at this process's niceness.
func niceWrap(nice int) []string {
	if nice == 0 {
		return nil
	}
	return []string{"nice", "-n", strconv.Itoa(nice)}
}

// autogroupFile is where Linux keeps the niceness of a session's
// autogroup (CONFIG_SCHED_AUTOGROUP).
const autogroupFile = "/proc/self/autogroup"

// RaiseSessionPriority gives this process's session, as a whole, the CPU
// weight of a process at TCGControlPlaneNice. It is for the supervisor of
// 'orrery mini up', which runs the VMs in a session of its own: where the
// kernel groups the CPU by session (autogroup, on by default in Debian for
// processes outside a cgroup with a CPU controller), a session's niceness
// weighs against other sessions and a process's only within its session,
// so without this the VMs would share the host with a build in a terminal
// as equals whatever their niceness. A kernel without autogroups has
// nothing to raise and is no error.
func RaiseSessionPriority() error {
	if _, err := os.Stat(autogroupFile); os.IsNotExist(err) {
		return nil
	}
	if err := os.WriteFile(autogroupFile, []byte(strconv.Itoa(TCGControlPlaneNice)), 0); err != nil {
		return fmt.Errorf("raise the CPU priority of the local cloud's session to niceness %d: %w", TCGControlPlaneNice, err)
	}
	return nil
}
