// Package bootstraptoken creates kubeadm bootstrap tokens: Secrets of type
// bootstrap.kubernetes.io/token in kube-system, which the API server
// accepts for a node's first contact until they expire, through package
// apiserver. Cache shares a fresh token between joins instead of making
// one per join.
package bootstraptoken

import (
	"context"
	"crypto/rand"
	"fmt"
	"net/http"
	"time"

	"github.com/orrery-dev/orrery/joinservice/internal/apiserver"
)

// Client creates bootstrap tokens (on a pod: with the connection of
// apiserver.InCluster).
type Client struct {
	// Server is the API server's URL, e.g. https://10.42.1.100:6443.
	Server string
	// Token authenticates; HTTP carries the cluster CA.
	Token string
	HTTP  *http.Client
	// Now is the clock; nil means time.Now.
	Now func() time.Time
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
	conn := &apiserver.Conn{Server: c.Server, Token: c.Token, HTTP: c.HTTP}
	code, answer, err := conn.Do(ctx, http.MethodPost, "/api/v1/namespaces/kube-system/secrets", body)
	if err != nil {
		return "", fmt.Errorf("create bootstrap token: %w", err)
	}
	if code != http.StatusCreated {
		return "", fmt.Errorf("create bootstrap token: API server answered %d %s: %s", code, http.StatusText(code), apiserver.Excerpt(answer))
	}
	return id + "." + secret, nil
}
