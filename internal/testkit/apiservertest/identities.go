package apiservertest

import (
	"context"
	"crypto/x509"
	"crypto/x509/pkix"
	"math/big"
	mathrand "math/rand/v2"
	"testing"

	authenticationv1 "k8s.io/api/authentication/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
)

// ConfigAs reaches the server as user in groups, with a client
// certificate of the cluster CA: ConfigAs(tb, "system:node:worker-0",
// "system:nodes") holds what the join service gives a worker's kubelet.
func (s *Server) ConfigAs(tb testing.TB, user string, groups ...string) *rest.Config {
	tb.Helper()
	certPEM, keyPEM := signLeaf(tb, s.ca, s.caKey, &x509.Certificate{
		SerialNumber: big.NewInt(mathrand.Int64()),
		Subject:      pkix.Name{CommonName: user, Organization: groups},
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	})
	return s.withCredentials(rest.TLSClientConfig{CertData: certPEM, KeyData: keyPEM}, "")
}

// TokenFor reaches the server with the token kubelet gives pod
// namespace/pod, which must exist: bound to the pod and, once the pod is
// bound to a node, naming that node (the authentication.kubernetes.io/
// node-name extra that policies can check), as a container reads it from
// its service-account volume.
func (s *Server) TokenFor(tb testing.TB, namespace, pod string) *rest.Config {
	tb.Helper()
	client, err := kubernetes.NewForConfig(s.Config)
	if err != nil {
		tb.Fatal(err)
	}
	ctx := context.Background()
	p, err := client.CoreV1().Pods(namespace).Get(ctx, pod, metav1.GetOptions{})
	if err != nil {
		tb.Fatalf("token for pod %s/%s: %v", namespace, pod, err)
	}
	sa := p.Spec.ServiceAccountName
	if sa == "" {
		sa = "default"
	}
	tr, err := client.CoreV1().ServiceAccounts(namespace).CreateToken(ctx, sa, &authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{
		BoundObjectRef: &authenticationv1.BoundObjectReference{Kind: "Pod", APIVersion: "v1", Name: p.Name, UID: p.UID},
	}}, metav1.CreateOptions{})
	if err != nil {
		tb.Fatalf("token of service account %s/%s for pod %s: %v", namespace, sa, pod, err)
	}
	return s.withCredentials(rest.TLSClientConfig{}, tr.Status.Token)
}

func (s *Server) withCredentials(tlsCfg rest.TLSClientConfig, token string) *rest.Config {
	tlsCfg.CAData = s.Config.CAData
	return &rest.Config{Host: s.Config.Host, TLSClientConfig: tlsCfg, BearerToken: token, QPS: s.Config.QPS, Burst: s.Config.Burst}
}
