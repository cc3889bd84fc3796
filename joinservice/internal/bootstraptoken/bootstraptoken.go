// Package bootstraptoken creates kubeadm bootstrap tokens: Secrets of type
// bootstrap.kubernetes.io/token in kube-system, which the API server
// accepts for a node's first contact until they expire. It talks to the
// API server with the pod's service account over plain HTTPS, so the join
// service needs no Kubernetes client library for this one call. Cache
// shares a fresh token between joins instead of making one per join.
package bootstraptoken

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"time"
)

// In-cluster credentials of a pod.
const ServiceAccountDir = "/var/run/secrets/kubernetes.io/serviceaccount"

// Client creates bootstrap tokens.
type Client struct {
	// Server is the API server's URL, e.g. https://10.42.1.100:6443.
	Server string
	// Token authenticates; HTTP carries the cluster CA.
	Token string
	HTTP  *http.Client
	// Now is the clock; nil means time.Now.
	Now func() time.Time
}

// InCluster builds a client from the pod's service account and the
// KUBERNETES_SERVICE_HOST/PORT environment.
func InCluster() (*Client, error) {
	host, port := os.Getenv("KUBERNETES_SERVICE_HOST"), os.Getenv("KUBERNETES_SERVICE_PORT")
	if host == "" || port == "" {
		return nil, fmt.Errorf("not running in a Kubernetes pod (KUBERNETES_SERVICE_HOST/PORT unset)")
	}
	token, err := os.ReadFile(filepath.Join(ServiceAccountDir, "token"))
	if err != nil {
		return nil, fmt.Errorf("read service account token: %w", err)
	}
	caPEM, err := os.ReadFile(filepath.Join(ServiceAccountDir, "ca.crt"))
	if err != nil {
		return nil, fmt.Errorf("read cluster CA: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(caPEM) {
		return nil, fmt.Errorf("cluster CA in %s is not PEM", ServiceAccountDir)
	}
	return &Client{
		Server: "https://" + host + ":" + port,
		Token:  string(bytes.TrimSpace(token)),
		HTTP:   &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}}},
	}, nil
}

// token alphabet and sizes fixed by kubeadm: [a-z0-9]{6}.[a-z0-9]{16}.
const alphabet = "abcdefghijklmnopqrstuvwxyz0123456789"

func randomString(n int) (string, error) {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		return "", err
	}
	for i := range b {
		// 256 % 36 != 0: reject-free mapping would bias a little; the
		// bias (about 0.4%) does not matter for a 15-minute token.
		b[i] = alphabet[int(b[i])%len(alphabet)]
	}
	return string(b), nil
}

// CreateToken creates a bootstrap token valid for ttl and returns it as
// "<id>.<secret>".
func (c *Client) CreateToken(ctx context.Context, ttl time.Duration) (string, error) {
	id, err := randomString(6)
	if err != nil {
		return "", err
	}
	secret, err := randomString(16)
	if err != nil {
		return "", err
	}
	now := time.Now
	if c.Now != nil {
		now = c.Now
	}
	body := map[string]any{
		"apiVersion": "v1",
		"kind":       "Secret",
		"type":       "bootstrap.kubernetes.io/token",
		"metadata":   map[string]any{"name": "bootstrap-token-" + id, "namespace": "kube-system"},
		"stringData": map[string]string{
			"description":                    "Orrery join service: joins of attested nodes (shared while fresh)",
			"token-id":                       id,
			"token-secret":                   secret,
			"expiration":                     now().Add(ttl).UTC().Format(time.RFC3339),
			"usage-bootstrap-authentication": "true",
			"usage-bootstrap-signing":        "true",
			"auth-extra-groups":              "system:bootstrappers:kubeadm:default-node-token",
		},
	}
	raw, err := json.Marshal(body)
	if err != nil {
		return "", err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.Server+"/api/v1/namespaces/kube-system/secrets", bytes.NewReader(raw))
	if err != nil {
		return "", err
	}
	req.Header.Set("Authorization", "Bearer "+c.Token)
	req.Header.Set("Content-Type", "application/json")
	resp, err := c.HTTP.Do(req)
	if err != nil {
		return "", fmt.Errorf("create bootstrap token: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusCreated {
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		return "", fmt.Errorf("create bootstrap token: API server answered %s: %s", resp.Status, bytes.TrimSpace(msg))
	}
	return id + "." + secret, nil
}
