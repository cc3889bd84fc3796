// Package etcd talks to a control plane's etcd member through etcd's own
// API (internal/proto/etcdpb), over TLS with a client certificate of the
// member's CA, as kubeadm sets etcd up: it takes snapshots, reads the
// member's status and the cluster's membership, and removes members.
package etcd

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"os"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
)

// Member is an etcd member and what proves a client to it.
type Member struct {
	// Endpoint is the member's client address, HOST:PORT.
	Endpoint string
	// CACert is its CA (PEM); ClientCert and ClientKey a client's
	// certificate and key from that CA.
	CACert, ClientCert, ClientKey string
}

// Kubeadm is the local etcd member of a kubeadm control plane, reached
// with the certificate kubeadm made for etcd's health checks: etcd runs
// without its own authentication, so any client its CA certified may take
// a snapshot.
var Kubeadm = Member{
	Endpoint:   "127.0.0.1:2379",
	CACert:     "/etc/kubernetes/pki/etcd/ca.crt",
	ClientCert: "/etc/kubernetes/pki/etcd/healthcheck-client.crt",
	ClientKey:  "/etc/kubernetes/pki/etcd/healthcheck-client.key",
}

// dial returns a connection to the member; it connects on the first
// call.
func (m Member) dial() (*grpc.ClientConn, error) {
	tlsCfg, err := m.tlsConfig()
	if err != nil {
		return nil, err
	}
	conn, err := grpc.NewClient("passthrough:///"+m.Endpoint, grpc.WithTransportCredentials(credentials.NewTLS(tlsCfg)))
	if err != nil {
		return nil, fmt.Errorf("reach etcd at %s: %w", m.Endpoint, err)
	}
	return conn, nil
}

func (m Member) tlsConfig() (*tls.Config, error) {
	caPEM, err := os.ReadFile(m.CACert)
	if err != nil {
		return nil, fmt.Errorf("read etcd's CA: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(caPEM) {
		return nil, fmt.Errorf("%s holds no PEM certificate", m.CACert)
	}
	cert, err := tls.LoadX509KeyPair(m.ClientCert, m.ClientKey)
	if err != nil {
		return nil, fmt.Errorf("read the client certificate for etcd: %w", err)
	}
	return &tls.Config{RootCAs: pool, Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}, nil
}
