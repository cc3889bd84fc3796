// Package apiserver is the join service's connection to the Kubernetes API
// server: the pod's service account over plain HTTPS, so that the few
// calls the service makes (the record of admitted nodes)
// need no Kubernetes client library.
package apiserver

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/netip"
	"net/url"
	"os"
	"path/filepath"
	"time"

	"github.com/orrery-dev/orrery/internal/records/kubeadmconfig"
	"github.com/orrery-dev/orrery/internal/records/measurementset"
	"github.com/orrery-dev/orrery/internal/records/orreryapi"
	"github.com/orrery-dev/orrery/internal/records/removednodes"
)

// ServiceAccountDir holds a pod's in-cluster credentials.
const ServiceAccountDir = "/var/run/secrets/kubernetes.io/serviceaccount"

// maxResponse bounds what is read of an answer: the objects the join
// service reads are small (a record, a Node, a list of a few measurement
// sets).
const maxResponse = 1 << 20

// Conn talks to the API server.
type Conn struct {
	// Server is the API server's URL, e.g. https://10.42.1.100:6443.
	Server string
	// Token authenticates; HTTP carries the cluster CA (and, in tests,
	// a client certificate instead of a token).
	Token string
	HTTP  *http.Client
}

// InCluster builds a connection from the pod's service account and the
// KUBERNETES_SERVICE_HOST/PORT environment.
func InCluster() (*Conn, error) {
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
	return &Conn{
		Server: "https://" + host + ":" + port,
		Token:  string(bytes.TrimSpace(token)),
		HTTP:   &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}}},
	}, nil
}

// ErrAnswerTooLong is returned for an answer longer than the caller reads.
var ErrAnswerTooLong = errors.New("the API server's answer is longer than the join service reads")

// Do sends body (JSON-encoded, or nothing if nil) to path and returns the
// status code and the answer, which may be up to 1 MiB (longer ones are
// ErrAnswerTooLong). Only a transport failure or a long answer is an
// error; the caller judges the status.
func (c *Conn) Do(ctx context.Context, method, path string, body any) (int, []byte, error) {
	return c.do(ctx, method, path, "application/json", body, maxResponse)
}

// DoPatch sends body as a JSON merge patch of the object at path.
func (c *Conn) DoPatch(ctx context.Context, path string, body any) (int, []byte, error) {
	return c.do(ctx, http.MethodPatch, path, "application/merge-patch+json", body, maxResponse)
}

func (c *Conn) do(ctx context.Context, method, path, contentType string, body any, max int64) (int, []byte, error) {
	var r io.Reader
	if body != nil {
		raw, err := json.Marshal(body)
		if err != nil {
			return 0, nil, err
		}
		r = bytes.NewReader(raw)
	}
	req, err := http.NewRequestWithContext(ctx, method, c.Server+path, r)
	if err != nil {
		return 0, nil, err
	}
	if c.Token != "" {
		req.Header.Set("Authorization", "Bearer "+c.Token)
	}
	if body != nil {
		req.Header.Set("Content-Type", contentType)
	}
	resp, err := c.HTTP.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	out, err := io.ReadAll(io.LimitReader(resp.Body, max+1))
	if err != nil {
		return 0, nil, fmt.Errorf("read the API server's answer: %w", err)
	}
	if int64(len(out)) > max {
		return 0, nil, fmt.Errorf("%w (%d bytes)", ErrAnswerTooLong, max)
	}
	return resp.StatusCode, out, nil
}

// Excerpt is the start of an error answer, for an error message.
func Excerpt(body []byte) string {
	const n = 512
	if len(body) > n {
		body = body[:n]
	}
	return string(bytes.TrimSpace(body))
}

// NodeExists reports whether the cluster has a Node called name that is
// not being deleted: a Node the owner deleted counts as gone at once, even
// while a finalizer (which a node's writers might add) keeps the object.
func (c *Conn) NodeExists(ctx context.Context, name string) (bool, error) {
	code, body, err := c.Do(ctx, http.MethodGet, "/api/v1/nodes/"+url.PathEscape(name), nil)
	if err != nil {
		return false, fmt.Errorf("read node %s: %w", name, err)
	}
	switch code {
	case http.StatusOK:
		var n struct {
			Metadata struct {
				DeletionTimestamp *string `json:"deletionTimestamp"`
			} `json:"metadata"`
		}
		if err := json.Unmarshal(body, &n); err != nil {
			return false, fmt.Errorf("decode node %s: %w", name, err)
		}
		return n.Metadata.DeletionTimestamp == nil, nil
	case http.StatusNotFound:
		return false, nil
	}
	return false, fmt.Errorf("read node %s: API server answered %d %s: %s", name, code, http.StatusText(code), Excerpt(body))
}

// MeasurementSets lists the cluster's accepted measurement sets (see
// internal/records/measurementset). Sets that do not parse are left out and named
// in the error beside the good ones.
func (c *Conn) MeasurementSets(ctx context.Context) ([]measurementset.Set, error) {
	code, body, err := c.Do(ctx, http.MethodGet, orreryapi.Path(orreryapi.MeasurementSets, ""), nil)
	if err != nil {
		return nil, fmt.Errorf("list the measurement sets: %w", err)
	}
	if code != http.StatusOK {
		return nil, fmt.Errorf("list the measurement sets: API server answered %d %s: %s", code, http.StatusText(code), Excerpt(body))
	}
	return measurementset.ParseList(body)
}

// RemovedNodes reads the nodes the owner removed (internal/records/removednodes);
// a cluster without the list has removed none.
func (c *Conn) RemovedNodes(ctx context.Context) (removednodes.List, error) {
	code, body, err := c.Do(ctx, http.MethodGet, "/api/v1/namespaces/"+removednodes.Namespace+"/configmaps/"+removednodes.ConfigMapName, nil)
	if err != nil {
		return nil, fmt.Errorf("read the removed nodes: %w", err)
	}
	switch code {
	case http.StatusOK:
	case http.StatusNotFound:
		return removednodes.List{}, nil
	default:
		return nil, fmt.Errorf("read the removed nodes: API server answered %d %s: %s", code, http.StatusText(code), Excerpt(body))
	}
	var cm struct {
		Data map[string]string `json:"data"`
	}
	if err := json.Unmarshal(body, &cm); err != nil {
		return nil, fmt.Errorf("decode %s/%s: %w", removednodes.Namespace, removednodes.ConfigMapName, err)
	}
	return removednodes.Parse(cm.Data)
}

// KubernetesVersion is the version the cluster runs: the kubernetesVersion
// of kubeadm's ClusterConfiguration. Only cluster administrators (kubeadm,
// the owner) can write it.
func (c *Conn) KubernetesVersion(ctx context.Context) (string, error) {
	data, err := c.kubeadmConfig(ctx)
	if err != nil {
		return "", err
	}
	return kubeadmconfig.KubernetesVersion(data)
}

// ControlPlaneVersions is the Kubernetes version each control plane's
// kubelet reports (Nodes labelled node-role.kubernetes.io/control-plane,
// a label no kubelet may set on itself).
func (c *Conn) ControlPlaneVersions(ctx context.Context) ([]string, error) {
	q := url.Values{"labelSelector": {"node-role.kubernetes.io/control-plane"}}
	code, body, err := c.Do(ctx, http.MethodGet, "/api/v1/nodes?"+q.Encode(), nil)
	if err != nil {
		return nil, fmt.Errorf("list the control planes' Nodes: %w", err)
	}
	if code != http.StatusOK {
		return nil, fmt.Errorf("list the control planes' Nodes: API server answered %d %s: %s", code, http.StatusText(code), Excerpt(body))
	}
	var l struct {
		Items []struct {
			Status struct {
				NodeInfo struct {
					KubeletVersion string `json:"kubeletVersion"`
				} `json:"nodeInfo"`
			} `json:"status"`
		} `json:"items"`
	}
	if err := json.Unmarshal(body, &l); err != nil {
		return nil, fmt.Errorf("decode the control planes' Nodes: %w", err)
	}
	var vs []string
	for _, n := range l.Items {
		if v := n.Status.NodeInfo.KubeletVersion; v != "" {
			vs = append(vs, v)
		}
	}
	return vs, nil
}

// ClusterNetworks is the cluster's Service and pod networks, and the
// extra names of the API server's certificate, from kubeadm's
// ClusterConfiguration.
func (c *Conn) ClusterNetworks(ctx context.Context) (services, pods []netip.Prefix, sans []string, err error) {
	data, err := c.kubeadmConfig(ctx)
	if err != nil {
		return nil, nil, nil, err
	}
	if services, pods, err = kubeadmconfig.Networks(data); err != nil {
		return nil, nil, nil, err
	}
	if sans, err = kubeadmconfig.CertSANs(data); err != nil {
		return nil, nil, nil, err
	}
	return services, pods, sans, nil
}

// kubeadmConfig reads the data of kubeadm's ConfigMap.
func (c *Conn) kubeadmConfig(ctx context.Context) (map[string]string, error) {
	code, body, err := c.Do(ctx, http.MethodGet, kubeadmconfig.Path, nil)
	if err != nil {
		return nil, fmt.Errorf("read kubeadm's cluster configuration: %w", err)
	}
	if code != http.StatusOK {
		return nil, fmt.Errorf("read kubeadm's cluster configuration: API server answered %d %s: %s", code, http.StatusText(code), Excerpt(body))
	}
	var cm struct {
		Data map[string]string `json:"data"`
	}
	if err := json.Unmarshal(body, &cm); err != nil {
		return nil, fmt.Errorf("decode %s/%s: %w", kubeadmconfig.Namespace, kubeadmconfig.ConfigMapName, err)
	}
	return cm.Data, nil
}
