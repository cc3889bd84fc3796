//go:build e2e

package e2e

import (
	"crypto/x509"
	"encoding/base64"
	"encoding/pem"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"k8s.io/client-go/tools/clientcmd"

	"github.com/orrery-dev/orrery/internal/records/admitted"
	"github.com/orrery-dev/orrery/internal/testkit/csrtest"
)

// kubeletServingCertificates: the API server checks kubelets' serving
// certificates against the kubelet-serving CA (the worker's pod logs,
// read earlier, came through one), each kubelet got its own approved by
// the join service's approver, signed by that CA for hours, and a request
// made with worker-0's kubelet credential for the control plane's address
// is denied.
func (s *suite) kubeletServingCertificates() {
	cp, worker := s.c.Nodes()[0], s.c.Nodes()[1]
	cmd, err := s.k("-n", "kube-system", "get", "pod", "kube-apiserver-"+cp.Name, "-o", "jsonpath={.spec.containers[0].command}")
	if err != nil || !strings.Contains(cmd, "--kubelet-certificate-authority=/etc/kubernetes/pki/kubelet-serving-ca.crt") {
		s.t.Fatalf("the API server does not check kubelets' serving certificates against the kubelet-serving CA: %v\n%s", err, cmd)
	}
	approved := func(node string) bool {
		out, _ := s.k("get", "csr", "--field-selector=spec.signerName=kubernetes.io/kubelet-serving",
			"-o", `jsonpath={range .items[*]}{.spec.username}={.status.conditions[0].reason}{"\n"}{end}`)
		return strings.Contains(out, "system:node:"+node+"=OrreryAdmittedNode")
	}
	for _, n := range []string{cp.Name, worker.Name} {
		s.waitFor(n+"'s kubelet serving certificate approved", patience(2*time.Minute), func() bool { return approved(n) })
	}
	s.servingCertificateIsNoAPIServers(worker.Name)

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
	s.nothingToMove(cp.Name)
}

// nothingToMove: a cluster made with the kubelet-serving CA has nothing
// to move there: the owner's upgrade reads each API server's CA from its
// pod and reaches every kubelet through the API server, as 'kubectl logs'
// does.
func (s *suite) nothingToMove(cp string) {
	running, err := s.k("get", "node", cp, "-o", "jsonpath={.status.nodeInfo.kubeletVersion}")
	if err != nil {
		s.t.Fatalf("%s's kubelet version: %v", cp, err)
	}
	out, err := s.orreryAsOwner("upgrade", "apply", "--kubernetes-version", strings.TrimSpace(running), "--dry-run")
	if err != nil || strings.Contains(out, "Kubelet serving certificates") || !strings.Contains(out, "nothing to do") {
		s.t.Fatalf("upgrade apply --dry-run to the version the cluster runs: %v\n%s\nwant nothing to do, and no move to the kubelet-serving CA", err, out)
	}
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

// servingCertificateIsNoAPIServers: the serving certificate node's
// kubelet was given lives at most admitted.ServingCertLifetime, and the
// cluster CA, which the owner's kubeconfig (and every pod) trusts for the
// API server, did not issue it.
func (s *suite) servingCertificateIsNoAPIServers(node string) {
	var certs string
	s.waitFor(node+"'s serving certificate signed", patience(time.Minute), func() bool {
		certs, _ = s.k("get", "csr", "--field-selector=spec.signerName=kubernetes.io/kubelet-serving",
			"-o", `jsonpath={range .items[?(@.spec.username=="system:node:`+node+`")]}{.status.certificate}{"\n"}{end}`)
		return strings.TrimSpace(certs) != ""
	})
	cfg, err := clientcmd.BuildConfigFromFlags("", s.kubeconfig())
	if err != nil {
		s.t.Fatal(err)
	}
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(cfg.CAData) {
		s.t.Fatal("the owner's kubeconfig holds no cluster CA")
	}
	for line := range strings.Lines(strings.TrimSpace(certs)) {
		if strings.TrimSpace(line) == "" {
			continue // a request denied, or not signed yet
		}
		der, err := base64.StdEncoding.DecodeString(strings.TrimSpace(line))
		if err != nil {
			s.t.Fatalf("%s's serving certificate: %v", node, err)
		}
		b, _ := pem.Decode(der)
		if b == nil {
			s.t.Fatalf("%s's serving certificate is not PEM", node)
		}
		cert, err := x509.ParseCertificate(b.Bytes)
		if err != nil {
			s.t.Fatal(err)
		}
		if life := cert.NotAfter.Sub(cert.NotBefore); life > admitted.ServingCertLifetime+10*time.Minute {
			s.t.Errorf("%s's serving certificate lives %s, want at most %s", node, life, admitted.ServingCertLifetime)
		}
		if _, err := cert.Verify(x509.VerifyOptions{Roots: roots, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny}}); err == nil {
			s.t.Errorf("%s's serving certificate (issuer %q) verifies against the cluster CA: a pod would take it for the API server", node, cert.Issuer.CommonName)
		}
		s.t.Logf("%s's serving certificate: issuer %q, valid %s", node, cert.Issuer.CommonName, cert.NotAfter.Sub(cert.NotBefore))
	}
}
