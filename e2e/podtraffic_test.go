//go:build e2e

package e2e

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/orrery-dev/orrery/internal/testkit/packetcapture"
)

// wireGuardPort is flannel's WireGuard port; flannelVXLANPort the port
// of its vxlan backend, which must see nothing.
const (
	wireGuardPort    = 51820
	flannelVXLANPort = 8472
)

// podTrafficEncrypted: while a pod on the worker asks the web pod on the
// control plane for a page, each side's words carrying a marker, the
// cloud's network (every interface of its namespace: the VMs' taps and
// the bridge, all the hypervisor sees of the nodes' traffic) carries
// WireGuard datagrams and neither marker. The bridge's own interface
// alone would not do: it sees only the host's traffic, not what it
// forwards from one VM to another. The same capture sees a marker
// sent over plain VXLAN (packetcapture's test), so this check can fail.
// The page is written with 'kubectl exec', through the web pod's kubelet
// and the serving certificate the API server checks.
func (s *suite) podTrafficEncrypted() {
	const what = "pod traffic between nodes crosses the cloud's network encrypted"
	s.p.doing(what)
	request, answer := randomMarker(s), randomMarker(s)
	if out, err := s.k("exec", "web", "--", "/usr/bin/busybox", "sh", "-c", "echo "+answer+" > /www/marker.html"); err != nil {
		s.t.Fatalf("kubectl exec into the web pod on cp-0: %v\n%s", err, out)
	}
	webIP, err := s.k("get", "pod", "web", "-o", "jsonpath={.status.podIP}")
	if err != nil || webIP == "" {
		s.t.Fatalf("the web pod's address: %v %q", err, webIP)
	}
	capture, err := packetcapture.Start("/run/netns/"+namespace, "", []byte(request), []byte(answer))
	if err != nil {
		s.t.Fatal(err)
	}
	defer capture.Stop()

	pod := "marker-client"
	manifest := strings.NewReplacer("CLIENT", pod, "WEB_IP", webIP, "REQUEST", request).Replace(markerClientManifest)
	file := filepath.Join(s.dir, pod+".yaml")
	if err := os.WriteFile(file, []byte(manifest), 0o644); err != nil {
		s.t.Fatal(err)
	}
	if out, err := s.k("apply", "-f", file); err != nil {
		s.t.Fatalf("apply: %v\n%s", err, out)
	}
	var logs string
	deadline := waitDeadline(s.t, patience(5*time.Minute))
	for !strings.Contains(logs, answer) && !strings.Contains(logs, "client gave up") {
		if time.Now().After(deadline) {
			s.t.Fatalf("%s: the client on worker-0 got no page from %s within %s:\n%s", what, webIP, patience(5*time.Minute), logs)
		}
		time.Sleep(3 * time.Second)
		logs, _ = s.k("logs", pod)
	}
	stats, err := capture.Stop()
	if err != nil {
		s.t.Fatal(err)
	}
	s.t.Logf("the cloud's network carried %d frames (%d bytes) while the pods talked; WireGuard datagrams %d, DNS %d, VXLAN %d", stats.Frames, stats.Bytes, stats.UDP[wireGuardPort], stats.UDP[53], stats.UDP[flannelVXLANPort])
	switch {
	case !strings.Contains(logs, answer):
		s.t.Fatalf("the client on worker-0 got no page from the web pod at %s:\n%s", webIP, logs)
	case stats.Seen[request] > 0 || stats.Seen[answer] > 0:
		s.t.Fatalf("the cloud's network carried the pods' words in clear text: the request's marker in %d frames, the answer's in %d", stats.Seen[request], stats.Seen[answer])
	case stats.UDP[wireGuardPort] == 0:
		s.t.Fatalf("no WireGuard datagram (UDP %d) crossed the cloud's network while the pods talked (%d frames, %d VXLAN datagrams): is flannel's backend WireGuard?", wireGuardPort, stats.Frames, stats.UDP[flannelVXLANPort])
	}
	s.k("delete", "pod", pod, "--wait=false")
	s.p.done(what)
}

func randomMarker(s *suite) string {
	b := make([]byte, 12)
	if _, err := rand.Read(b); err != nil {
		s.t.Fatal(err)
	}
	return fmt.Sprintf("orrery-marker-%s", hex.EncodeToString(b))
}

// markerClientManifest asks the web pod on cp-0, at its pod address, for
// the page that carries the answer's marker, with the request's marker
// in a header.
const markerClientManifest = `apiVersion: v1
kind: Pod
metadata: {name: CLIENT, namespace: default}
spec:
  nodeName: worker-0
  restartPolicy: Never
  containers:
  - name: client
    image: ghcr.io/flannel-io/flannel:v0.28.4
    imagePullPolicy: Never
    command:
    - /usr/bin/busybox
    - sh
    - -c
    - |
      end=$(( $(busybox date +%s) + 240 ))
      until printf 'GET /marker.html HTTP/1.0\r\nX-Marker: REQUEST\r\n\r\n' | busybox nc -w 3 WEB_IP 8080 | busybox grep orrery-marker; do
        [ "$(busybox date +%s)" -lt "$end" ] || { echo "client gave up: no page from WEB_IP"; exit 1; }
        sleep 3
      done
`
