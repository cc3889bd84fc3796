//go:build e2e

package e2e

import (
	"encoding/base64"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/orrery-dev/orrery/internal/testkit/csrtest"
)

// kubeletServingCertificates: the API server checks kubelets' serving
// certificates against the cluster CA (the worker's pod logs, read
// earlier, came through one), each kubelet got its own approved by the
// join service's approver, and a request made with worker-0's kubelet
// credential for the control plane's address is denied.
func (s *suite) kubeletServingCertificates() {
	cp, worker := s.c.Nodes()[0], s.c.Nodes()[1]
	cmd, err := s.k("-n", "kube-system", "get", "pod", "kube-apiserver-"+cp.Name, "-o", "jsonpath={.spec.containers[0].command}")
	if err != nil || !strings.Contains(cmd, "--kubelet-certificate-authority=/etc/kubernetes/pki/ca.crt") {
		s.t.Fatalf("the API server does not check kubelets' serving certificates: %v\n%s", err, cmd)
	}
	approved := func(node string) bool {
		out, _ := s.k("get", "csr", "--field-selector=spec.signerName=kubernetes.io/kubelet-serving",
			"-o", `jsonpath={range .items[*]}{.spec.username}={.status.conditions[0].reason}{"\n"}{end}`)
		return strings.Contains(out, "system:node:"+node+"=OrreryAdmittedNode")
	}
	for _, n := range []string{cp.Name, worker.Name} {
		s.waitFor(n+"'s kubelet serving certificate approved", patience(2*time.Minute), func() bool { return approved(n) })
	}

	name := "e2e-worker-asks-for-" + cp.Name
	file := filepath.Join(s.dir, name+".yaml")
	if err := os.WriteFile(file, []byte(servingRequest(s, name, worker.Name, cp.IP.String())), 0o644); err != nil {
		s.t.Fatal(err)
	}
	if out, err := s.k(append([]string{"create", "-f", file}, workerIdentities[0].as...)...); err != nil {
		s.t.Fatalf("worker-0's kubelet credential could not even ask: %v\n%s", err, out)
	}
	var cond string
	s.waitFor("a serving certificate for "+cp.Name+"'s address, asked by "+worker.Name+", denied", patience(time.Minute), func() bool {
		cond, _ = s.k("get", "csr", name, "-o", `jsonpath={.status.conditions[0].type} {.status.conditions[0].message}`)
		return strings.TrimSpace(cond) != ""
	})
	if !strings.HasPrefix(cond, "Denied") || !strings.Contains(cond, cp.IP.String()) {
		s.t.Fatalf("worker-0's request for %s's address %s: %q, want denied naming the address", cp.Name, cp.IP, cond)
	}
	s.k("delete", "csr", name, "--wait=false")
}

// servingRequest is a CertificateSigningRequest, as a kubelet makes it,
// for node's serving certificate naming ip.
func servingRequest(s *suite, name, node, ip string) string {
	request := base64.StdEncoding.EncodeToString(csrtest.KubeletRequest(s.t, node, ip))
	return fmt.Sprintf(`apiVersion: certificates.k8s.io/v1
kind: CertificateSigningRequest
metadata:
  name: %s
spec:
  signerName: kubernetes.io/kubelet-serving
  usages: [digital signature, server auth]
  request: %s
`, name, request)
}
