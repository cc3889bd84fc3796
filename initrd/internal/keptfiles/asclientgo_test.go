package keptfiles

import (
	"crypto/x509"
	"strings"
	"testing"

	"k8s.io/client-go/tools/clientcmd"
)

// agreesWithClientGo fails t if b, a kubeconfig checkKubeconfig accepted,
// reads otherwise in client-go, which kubelet and the control plane's
// components load it with: every cluster at endpoint, over checked TLS,
// trusting ca alone, and no user running a program.
func agreesWithClientGo(t *testing.T, b []byte, ca *x509.Certificate) {
	t.Helper()
	cfg, err := clientcmd.Load(b)
	if err != nil {
		return // kubelet would not start with it: it runs nothing
	}
	for name, c := range cfg.Clusters {
		if c.Server != "https://"+endpoint || c.InsecureSkipTLSVerify || c.ProxyURL != "" {
			t.Fatalf("checkKubeconfig accepted %q, whose cluster %s client-go reads as server %q, insecure %t, proxy %q", b, name, c.Server, c.InsecureSkipTLSVerify, c.ProxyURL)
		}
		if c.CertificateAuthority != "" && c.CertificateAuthority != caCertPath {
			t.Fatalf("checkKubeconfig accepted %q, whose cluster %s client-go reads as trusting %s", b, name, c.CertificateAuthority)
		}
		if len(c.CertificateAuthorityData) > 0 {
			certs, err := parseCerts(c.CertificateAuthorityData)
			if err != nil || len(certs) != 1 || !certs[0].Equal(ca) {
				t.Fatalf("checkKubeconfig accepted %q, whose cluster %s client-go reads as trusting another CA", b, name)
			}
		}
	}
	for name, u := range cfg.AuthInfos {
		if u.Exec != nil || u.AuthProvider != nil {
			t.Fatalf("checkKubeconfig accepted %q, whose user %s client-go reads as running a program", b, name)
		}
	}
}

// A kubeconfig with a second copy of a member under a name that folds to
// it (a long s, an upper-case letter) shows encoding/json's folding
// decoder one value and client-go, which matches names exactly, another:
// root on a node could keep a kubelet.conf whose harmless copy the check
// read while kubelet trusted any server. Each is refused, and nothing
// accepted reads otherwise in client-go.
func TestKubeconfigsAreReadAsClientGoReadsThem(t *testing.T) {
	n := worker(t)
	ca, err := x509.ParseCertificate(n.ca)
	if err != nil {
		t.Fatal(err)
	}
	good := kubeconfigWith(n.ca, "https://"+endpoint, certUser)
	evilCluster := "- cluster:\n    insecure-skip-tls-verify: true\n    server: https://203.0.113.9:6443\n  name: default-cluster\n"
	goodCluster := good[strings.Index(good, "- cluster:"):strings.Index(good, "contexts:")]
	for name, data := range map[string]string{
		"folded clusters": strings.Replace(good, "clusters:\n"+goodCluster, "clusters:\n"+evilCluster+"cluſters:\n"+goodCluster, 1),
		"upper clusters":  strings.Replace(good, "clusters:\n"+goodCluster, "clusters:\n"+evilCluster+"Clusters:\n"+goodCluster, 1),
		"folded server": strings.Replace(good, "    server: https://"+endpoint,
			"    server: https://203.0.113.9:6443\n    ſerver: https://"+endpoint, 1),
		"folded exec": strings.Replace(good, certUser, certUser+"    exeç:\n      command: /bin/sh\n", 1),
		"folded user": strings.Replace(good, "  user:\n"+certUser, "  user:\n    exec:\n      apiVersion: client.authentication.k8s.io/v1\n      command: /bin/sh\n  uſer:\n"+certUser, 1),
	} {
		t.Run(name, func(t *testing.T) {
			if !strings.Contains(data, "203.0.113.9") && !strings.Contains(data, "/bin/sh") {
				t.Fatalf("the case plants nothing:\n%s", data)
			}
			err := checkKubeconfig([]byte(data), ca, endpoint)
			if err == nil {
				agreesWithClientGo(t, []byte(data), ca)
				t.Fatalf("checkKubeconfig accepted:\n%s", data)
			}
		})
	}
	if err := checkKubeconfig([]byte(good), ca, endpoint); err != nil {
		t.Fatalf("kubelet's own kubeconfig: %v", err)
	}
	agreesWithClientGo(t, []byte(good), ca)
}

// Whatever checkKubeconfig accepts, client-go reads the same way.
func FuzzKubeconfigAsClientGo(f *testing.F) {
	n := worker(f)
	ca, err := x509.ParseCertificate(n.ca)
	if err != nil {
		f.Fatal(err)
	}
	good := kubeconfigWith(n.ca, "https://"+endpoint, certUser)
	f.Add([]byte(good))
	f.Add([]byte(strings.Replace(good, "    server:", "    Server: https://203.0.113.9:6443\n    server:", 1)))
	f.Fuzz(func(t *testing.T, b []byte) {
		if checkKubeconfig(b, ca, endpoint) == nil {
			agreesWithClientGo(t, b, ca)
		}
	})
}
