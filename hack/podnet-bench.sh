#!/usr/bin/env bash
# Measures pod-to-pod throughput and latency between two nodes of a running
# cluster: a pod on the worker downloads a file from a pod on the control
# plane, by pod address, and pings it. Prints one line of numbers. Not part
# of CI: it needs a cluster with a worker ('orrery mini up --workers 1' and
# 'orrery init'), and takes a few minutes under TCG.
#
#   KUBECONFIG=ws/orrery-admin.conf hack/podnet-bench.sh [MiB] [runs]
#
# The numbers are what the pods get through the cluster's pod network as it
# is configured (flannel's backend: kubectl -n kube-system get cm
# kube-flannel-cfg). The pods use the flannel image the node image bakes
# in, whose busybox has nc, ping and time.
set -euo pipefail
mib=${1:-32}
runs=${2:-3}
server=${SERVER_NODE:-cp-0}
client=${CLIENT_NODE:-worker-0}
image=$(kubectl -n kube-system get ds kube-flannel-ds -o jsonpath='{.spec.template.spec.containers[0].image}')
backend=$(kubectl -n kube-system get cm kube-flannel-cfg -o jsonpath='{.data.net-conf\.json}' | sed -n 's/.*"Type": *"\([a-z]*\)".*/\1/p')

cleanup() { kubectl delete pod podnet-server podnet-client --wait=false >/dev/null 2>&1 || true; }
trap cleanup EXIT INT TERM
cleanup
kubectl wait --for=delete pod/podnet-server pod/podnet-client --timeout=2m >/dev/null 2>&1 || true

kubectl apply -f - >/dev/null <<YAML
apiVersion: v1
kind: Pod
metadata: {name: podnet-server}
spec:
  nodeName: $server
  tolerations: [{operator: Exists}]
  containers:
  - name: web
    image: $image
    imagePullPolicy: Never
    command: ["/usr/bin/busybox", "sh", "-c", "mkdir -p /www && busybox dd if=/dev/urandom of=/www/blob bs=1048576 count=$mib 2>/dev/null && exec busybox httpd -f -p 8080 -h /www"]
    readinessProbe: {tcpSocket: {port: 8080}, periodSeconds: 2}
YAML
kubectl wait --for=condition=Ready pod/podnet-server --timeout=5m >/dev/null
ip=$(kubectl get pod podnet-server -o jsonpath='{.status.podIP}')

kubectl apply -f - >/dev/null <<YAML
apiVersion: v1
kind: Pod
metadata: {name: podnet-client}
spec:
  nodeName: $client
  restartPolicy: Never
  containers:
  - name: client
    image: $image
    imagePullPolicy: Never
    command:
    - /usr/bin/busybox
    - sh
    - -c
    - |
      busybox ping -c 3 -q $ip >/dev/null 2>&1 || true
      for i in \$(busybox seq $runs); do
        busybox time -f "download %e s" busybox sh -c "printf 'GET /blob HTTP/1.0\r\n\r\n' | busybox nc $ip 8080 | busybox wc -c"
      done
      busybox ping -c 20 -i 0.2 -q $ip | busybox tail -1
      echo done
YAML
for _ in $(seq 200); do
	out=$(kubectl logs podnet-client 2>/dev/null || true)
	[[ $out == *done* ]] && break
	sleep 3
done
[[ $out == *done* ]] || { echo "podnet-bench: the client did not finish:" >&2; echo "$out" >&2; exit 1; }
# Each download prints its byte count (the HTTP answer: headers and the
# blob), then its time; MB/s per run from the bytes that came. A short
# download is an error, not a fast one.
rates=$(awk -v want=$((mib << 20)) '
	/^[0-9]+$/ {b[++nb] = $1}
	/^download/ {d[++nd] = $2}
	END {
		# stdout and stderr interleave in the log: pair them by order.
		for (i = 1; i <= nd; i++) {
			if (b[i] < want) { print "short: " b[i] " bytes"; exit 1 }
			printf "%s%.2f", sep, b[i] / 1e6 / d[i]; sep = " "
		}
	}' <<<"$out") || { echo "podnet-bench: a download came short ($rates):" >&2; echo "$out" >&2; exit 1; }
rtt=$(sed -n 's/.*min\/avg\/max = \([0-9.\/]*\) ms.*/\1/p' <<<"$out")
echo "podnet-bench: backend $backend, $client -> $server, ${mib} MiB x $runs: MB/s $rates; ping min/avg/max ms $rtt"
