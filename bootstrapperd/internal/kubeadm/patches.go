package kubeadm

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
)

// Settings for a control plane whose CPU may be starved for minutes: a
// confidential VM on a busy host, or (where they were measured) two TCG
// guests of 2 vCPUs sharing 2 host cores while a worker boots. There,
// kubeadm's defaults made a slow cluster a broken one:
//   - the API server's liveness probe asks /livez, which includes a 2 s
//     etcd read; with etcd slow, eight failed probes (80 s) had kubelet
//     kill the API server, whose restart then cost minutes of guest CPU,
//     so one slow minute became an outage (three restarts in 25 min);
//   - etcd answered "request timed out" after its 7 s request timeout
//     (5 s + 2 election timeouts of 1 s), and its readiness probe timed
//     out 13 times, while it never needed a restart.
//
// Restarting the API server never makes etcd faster, so its liveness no
// longer depends on etcd (readiness still does: a pod that cannot reach
// etcd is not ready, but it is not killed). Every control-plane liveness
// probe waits 30 s for an answer and kills only after two minutes of
// misses in a row: a deadlocked component still gets restarted.
//
// The probes run every 30 s, not kubeadm's 10 s, with 4 misses instead
// of 12: the same two minutes before a kill. Each probe of the controller
// manager and the scheduler is a new TLS handshake with a self-signed
// RSA-2048 key, costly under emulation, and each of the API server's is
// a request it authorises; an idle control plane ran 4 of them every
// 10 s for no decision that needs them sooner.
const (
	probeTimeoutSeconds    = 30
	livenessPeriodSeconds  = 30
	probeFailureThreshold  = 4
	apiServerLivenessPath  = "/livez?exclude=etcd"
	etcdHeartbeatMillis    = "500"
	etcdElectionMillis     = "5000"
	etcdHealthCheckTimeout = "10s"
	// etcdProgressNotifyInterval: see etcdArgs.
	etcdProgressNotifyInterval = "30s"
	// controlPlaneHealthCheck is how long kubeadm waits for each
	// control-plane component to come up (default 4 min). It also sets the
	// startup probes' budget: an API server that took 4 min to start
	// under load was killed before it was ready. 10 min was still short
	// with one host core kept busy (kubeadm: "kube-apiserver is not healthy
	// after 10m0s", its second instance answering 403 because its RBAC
	// roles were not yet written). With apiServerWait before it, kubeadm
	// init stays within orrery init's 30 min.
	controlPlaneHealthCheck = "15m0s"
	// kubeletHealthCheck is how long kubeadm waits for kubelet's own
	// health endpoint after starting it (default 4 min), before any
	// control-plane pod runs. A third emulated control plane joining
	// two that already ran on two host cores failed its join about 4
	// min in, and kubeadm's reset started it over from nothing.
	kubeletHealthCheck = "15m0s"
	// apiServerWait bounds each of kubeadm's waits for the API server
	// (kubeadm's defaults: 1 min for an API call, 5 min for a joining
	// kubelet's TLS bootstrap and for discovery). The first of them
	// starts with kubelet, before etcd and the API server run: under
	// TCG on 2 host cores the API server first answered kubeadm 1m11s
	// after that unloaded, and 2m34s, 5m17s and more than 5 min
	// (kubeadm: "could not bootstrap the admin user ... context
	// deadline exceeded", while the API server, started 1.5 min into
	// the wait, was still at "TLS handshake timeout") with one host
	// core kept busy. Three times the slowest seen: a slow host delays
	// kubeadm, it does not fail it, and orrery init's own deadline (30
	// min) still ends a cluster that never comes up.
	apiServerWait = "15m0s"
	// etcdWait is how long kubeadm's etcd client waits for etcd: a
	// joining control plane's new member must have caught up with the
	// leader before kubeadm promotes it, and each of its calls gives up
	// after kubeadm's 2 min. With three emulated control planes on two
	// host cores, the second's join failed so ("failed to get member ...
	// status: context deadline exceeded", 2 min after its etcd pod was
	// written), and every later attempt started over.
	etcdWait = "15m0s"
	// tlsBootstrapWait is how long a joining node's kubeadm waits for its
	// kubelet's first certificate. A joining control plane's kubelet asks
	// its own API server (kubeadm's ControlPlaneKubeletLocalMode), which
	// must start first: with three emulated control planes on two host
	// cores, the second's API server still timed out TLS handshakes 15
	// min after it started, kubeadm gave up, and its reset took the new
	// etcd member and everything done with it. A wait that ends in a
	// retry only starts the same work over.
	tlsBootstrapWait = "40m0s"
)

// etcdArgs slow down etcd's raft clock by five: its request timeout
// grows from 7 s to 15 s, and a second member that is starved for a few
// seconds does not call an election.
//
// They also space etcd's progress notifications (kubeadm: every 5 s):
// etcd sends one on each of the API server's watches, one per resource
// type in its watch caches, and the idle API server spent a sixth of its
// CPU in its etcd client's gRPC reader and writer. The API server asks etcd
// for progress itself when a read must be current (consistent reads from
// the watch cache), so the periodic ones only keep the caches' resource
// versions fresh for the bookmarks it sends its watchers once a minute;
// it compacts etcd's history every 5 minutes, so a watch resumed from a
// bookmark 30 s older than it would have been is still served.
var etcdArgs = []arg{
	{Name: "heartbeat-interval", Value: etcdHeartbeatMillis},
	{Name: "election-timeout", Value: etcdElectionMillis},
	{Name: "watch-progress-notify-interval", Value: etcdProgressNotifyInterval},
}

// apiServerArgs give the API server's etcd checks (in /readyz) the time
// etcd may take on a loaded machine, instead of 2 s.
var apiServerArgs = []arg{
	{Name: "etcd-healthcheck-timeout", Value: etcdHealthCheckTimeout},
	{Name: "etcd-readycheck-timeout", Value: etcdHealthCheckTimeout},
}

// patchFiles are kubeadm's patches for the control-plane static pods
// (strategic merge patches, file name = target+type), applied by both
// `kubeadm init` and a control plane's `kubeadm join`.
var patchFiles = map[string]string{
	"kube-apiserver+strategic.yaml":          probePatch("kube-apiserver", apiServerLivenessPath, true, controlPlaneCPURequest),
	"etcd+strategic.yaml":                    probePatch("etcd", "", true, controlPlaneCPURequest),
	"kube-controller-manager+strategic.yaml": probePatch("kube-controller-manager", "", false, ""),
	"kube-scheduler+strategic.yaml":          probePatch("kube-scheduler", "", true, ""),
}

// controlPlaneCPURequest is the CPU that etcd and the API server request,
// instead of kubeadm's 100m and 250m. A request is also the container's
// cgroup CPU weight, which decides who runs when the node's CPU is short:
// with kubeadm's values etcd, which every other component waits on, had
// the smallest share of all (a tenth of the pods' when all want the CPU),
// and in a run where a worker joined while the control plane settled
// (exp1, TCG, 2 host cores) etcd logged 900 "apply request took too long"
// in six minutes, up to 2.6 s, while its own work is a fifth of a vCPU
// (kubelet's stats summary: etcd 0.19, the API server 0.41 of the node's
// 1.39). With 500m each they get two thirds of the pods' share when
// starved and only what they use otherwise. The control-plane pods and
// the services then request 1.6 of a 2-vCPU node's 2 CPUs.
const controlPlaneCPURequest = "500m"

// readinessPeriodSeconds: kubeadm probes the readiness of etcd, the API
// server and the scheduler every second, the API server's and the
// scheduler's each over a new TLS connection, and the API server's /readyz
// reads from etcd each time. Under emulation those probes alone kept a
// control plane busy: on an idle one (kubelet's stats summary) the
// scheduler, with no pod to schedule, used 0.12 of the node's 2 vCPUs,
// three times the controller manager, which has no readiness probe;
// kubelet, which runs the probes, used 0.42, and the node 1.66 of 2, so
// etcd's own answers timed out. Readiness of a static pod only reports;
// every 10 s (as liveness) is often enough.
const readinessPeriodSeconds = 10

// probePatch relaxes the liveness probe of container, replaces its path
// when livenessPath is set, slows its readiness probe when it has one and
// sets its CPU request when cpuRequest is set.
//
// It also keeps the last lines of a container that failed in its pod's
// status (FallbackToLogsOnError): the control-plane components exit on
// errors they cannot recover from (a lost leader lease, an API server
// that does not answer their start), and kubelet keeps only the previous
// container's log, gone with the next restart or a reboot: in one full
// e2e run on an idle host the controller manager restarted four times and
// none of its logs was left to say why.
func probePatch(container, livenessPath string, readiness bool, cpuRequest string) string {
	path := ""
	if livenessPath != "" {
		path = fmt.Sprintf("\n      httpGet:\n        path: %q", livenessPath)
	}
	patch := fmt.Sprintf(`spec:
  containers:
  - name: %s
    terminationMessagePolicy: FallbackToLogsOnError
    livenessProbe:%s
      periodSeconds: %d
      timeoutSeconds: %d
      failureThreshold: %d
`, container, path, livenessPeriodSeconds, probeTimeoutSeconds, probeFailureThreshold)
	if readiness {
		patch += fmt.Sprintf(`    readinessProbe:
      periodSeconds: %d
      timeoutSeconds: %d
`, readinessPeriodSeconds, readinessPeriodSeconds)
	}
	if cpuRequest != "" {
		patch += fmt.Sprintf(`    resources:
      requests:
        cpu: %s
`, cpuRequest)
	}
	return patch
}

// coreDNSPatchFile is kubeadm's patch of the CoreDNS Deployment it
// creates at init.
const coreDNSPatchFile = "corednsdeployment+strategic.yaml"

// coreDNSPatch points CoreDNS at the API server of the control-plane
// endpoint instead of the kubernetes Service. The Service works only once
// kube-proxy has written its rules on the node, and under load that took
// minutes: CoreDNS waited for the API the whole time ("starting server
// with unsynced Kubernetes API"), and so did every cluster that needed DNS.
// kubelet, kube-proxy, flannel and the join service reach the API server
// the same way, through the endpoint, not the Service.
//
// CoreDNS runs on control planes only (kubeadm gives it their taint's
// toleration): its service account lists every pod in the cluster, and it
// answers every pod's name lookups, neither of which root on a worker
// should hold.
func coreDNSPatch(endpoint string) (string, error) {
	host, port, err := net.SplitHostPort(endpoint)
	if err != nil {
		return "", fmt.Errorf("control-plane endpoint %q: %w", endpoint, err)
	}
	return fmt.Sprintf(`spec:
  template:
    spec:
      nodeSelector:
        node-role.kubernetes.io/control-plane: ""
      containers:
      - name: coredns
        env:
        - name: KUBERNETES_SERVICE_HOST
          value: %q
        - name: KUBERNETES_SERVICE_PORT
          value: %q
`, host, port), nil
}

// workerKubeletPatch is kubeadm's patch of a worker's kubelet
// configuration (a JSON merge patch: null removes the key). A worker runs
// no static pod, and kubeadm's cluster-wide configuration names a
// directory that only control planes have: the worker's kubelet logged
// "Unable to read config path" every second, 1,890 of the worker's 4,445
// journal entries in one run. Without the path kubelet reads no static
// pod at all, which a worker's kept kubelet configuration is then also
// held to (keptfiles).
var workerKubeletPatch = map[string]string{"kubeletconfiguration+merge.yaml": "staticPodPath: null\n"}

// writePatches writes patchFiles and extra (file name to patch) into dir,
// replacing what was there.
func writePatches(dir string, extra map[string]string) error {
	return writePatchFiles(dir, patchFiles, extra)
}

// writePatchFiles writes each set of patches (file name to patch) into
// dir, and nothing else: kubeadm applies every file there.
func writePatchFiles(dir string, sets ...map[string]string) error {
	if err := os.RemoveAll(dir); err != nil {
		return fmt.Errorf("clear kubeadm patch directory: %w", err)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("create kubeadm patch directory: %w", err)
	}
	for _, files := range sets {
		for name, data := range files {
			if err := os.WriteFile(filepath.Join(dir, name), []byte(data), 0o600); err != nil {
				return fmt.Errorf("write kubeadm patch: %w", err)
			}
		}
	}
	return nil
}
