// Package etcdsnapshot takes a snapshot of a control plane's etcd member
// through etcd's own snapshot call, over TLS with a client certificate of
// the member's CA, as kubeadm sets etcd up.
package etcdsnapshot

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"os"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	"github.com/orrery-dev/orrery/internal/proto/etcdsnapshotpb"
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

// Stream takes a snapshot and hands each part to send, with what the
// member says is still to come. The last part is the database's SHA-256,
// which Check verifies.
func (m Member) Stream(ctx context.Context, send func(data []byte, remaining uint64) error) error {
	tlsCfg, err := m.tlsConfig()
	if err != nil {
		return err
	}
	conn, err := grpc.NewClient("passthrough:///"+m.Endpoint, grpc.WithTransportCredentials(credentials.NewTLS(tlsCfg)))
	if err != nil {
		return fmt.Errorf("reach etcd at %s: %w", m.Endpoint, err)
	}
	defer conn.Close()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	// A snapshot is as large as the database: etcd sends it in parts of
	// 32 KiB.
	stream, err := etcdsnapshotpb.NewMaintenanceClient(conn).Snapshot(ctx, &etcdsnapshotpb.SnapshotRequest{})
	if err != nil {
		return fmt.Errorf("ask etcd at %s for a snapshot: %w", m.Endpoint, err)
	}
	for {
		r, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("etcd's snapshot from %s: %w", m.Endpoint, err)
		}
		if err := send(r.GetBlob(), r.GetRemainingBytes()); err != nil {
			return err
		}
	}
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
