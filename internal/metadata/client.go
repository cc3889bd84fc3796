package metadata

import (
	"bytes"
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"net/netip"
	"net/url"
	"strings"
	"time"
	"unicode"

	"golang.org/x/crypto/bcrypt"
)

// maxResponse is the largest answer the client reads; the biggest real
// one, /peers, is a few hundred bytes per node.
const maxResponse = 1 << 20

// defaultClient is used when Client.HTTP is nil. The timeout keeps a node
// from hanging on a metadata service that accepts but never answers.
var defaultClient = &http.Client{Timeout: 10 * time.Second}

// Client asks the metadata API. Its zero value is not usable: set BaseURL.
type Client struct {
	// BaseURL is the API's root, e.g. "http://169.254.169.254".
	BaseURL string
	// HTTP makes the requests. Nil means a client with a 10 s timeout.
	HTTP *http.Client
}

// StatusError is returned when the API answers with a status other than
// 200 OK. A 404 for an existing endpoint means the service does not know
// the caller's address.
type StatusError struct {
	Path       string
	StatusCode int
	// Body is the service's error message, or the start of the body if it
	// had none, made printable.
	Body string
}

func (e *StatusError) Error() string {
	return fmt.Sprintf("metadata service answered GET %s with %d %s: %q", e.Path, e.StatusCode, http.StatusText(e.StatusCode), e.Body)
}

// Self returns the calling VM's own instance.
func (c *Client) Self(ctx context.Context) (Instance, error) {
	b, err := c.get(ctx, PathSelf)
	if err != nil {
		return Instance{}, err
	}
	in, err := decodeSelf(b)
	if err != nil {
		return Instance{}, fmt.Errorf("decode metadata %s: %w", PathSelf, err)
	}
	return in, nil
}

// Peers returns every instance, sorted by role, then name.
func (c *Client) Peers(ctx context.Context) ([]Instance, error) {
	b, err := c.get(ctx, PathPeers)
	if err != nil {
		return nil, err
	}
	ins, err := decodePeers(b)
	if err != nil {
		return nil, fmt.Errorf("decode metadata %s: %w", PathPeers, err)
	}
	return ins, nil
}

// Endpoint returns the control plane's API server address.
func (c *Client) Endpoint(ctx context.Context) (netip.AddrPort, error) {
	b, err := c.get(ctx, PathEndpoint)
	if err != nil {
		return netip.AddrPort{}, err
	}
	ep, err := decodeEndpoint(b)
	if err != nil {
		return netip.AddrPort{}, fmt.Errorf("decode metadata %s: %w", PathEndpoint, err)
	}
	return ep, nil
}

// InitSecretHash returns the bcrypt hash of the init secret.
func (c *Client) InitSecretHash(ctx context.Context) ([]byte, error) {
	b, err := c.get(ctx, PathInitSecretHash)
	if err != nil {
		return nil, err
	}
	h, err := decodeInitSecretHash(b)
	if err != nil {
		return nil, fmt.Errorf("decode metadata %s: %w", PathInitSecretHash, err)
	}
	return h, nil
}

// get fetches path and returns the body of a 200 answer.
func (c *Client) get(ctx context.Context, path string) ([]byte, error) {
	base, err := url.Parse(c.BaseURL)
	if err != nil || (base.Scheme != "http" && base.Scheme != "https") || base.Host == "" {
		return nil, fmt.Errorf("invalid metadata base URL %q: want http://host[:port], e.g. http://169.254.169.254", c.BaseURL)
	}
	u := strings.TrimSuffix(base.String(), "/") + path
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return nil, fmt.Errorf("metadata request: %w", err)
	}
	req.Header.Set("Accept", "application/json")
	hc := c.HTTP
	if hc == nil {
		hc = defaultClient
	}
	resp, err := hc.Do(req)
	if err != nil {
		return nil, fmt.Errorf("ask metadata service (is the VM's network up?): %w", err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxResponse+1))
	if err != nil {
		return nil, fmt.Errorf("read metadata %s: %w", path, err)
	}
	if len(body) > maxResponse {
		return nil, fmt.Errorf("metadata %s: answer larger than %d bytes: is BaseURL the metadata service?", path, maxResponse)
	}
	if resp.StatusCode != http.StatusOK {
		return nil, &StatusError{Path: path, StatusCode: resp.StatusCode, Body: errorExcerpt(body)}
	}
	if mt, _, err := mime.ParseMediaType(resp.Header.Get("Content-Type")); err != nil || mt != "application/json" {
		return nil, fmt.Errorf("metadata %s: answer has content type %q, want application/json: is BaseURL the metadata service?", path, resp.Header.Get("Content-Type"))
	}
	return body, nil
}

// errorExcerpt returns the error message of a JSON error body, or else the
// body's start, for an error message.
func errorExcerpt(body []byte) string {
	var e ErrorAnswer
	if json.Unmarshal(body, &e) == nil && e.Error != "" {
		body = []byte(e.Error)
	}
	const max = 200
	s := strings.ToValidUTF8(string(body), "\uFFFD")
	s = strings.Map(func(r rune) rune {
		if unicode.IsPrint(r) {
			return r
		}
		return ' '
	}, s)
	if len(s) > max {
		s = strings.ToValidUTF8(s[:max], "") + "..."
	}
	return strings.TrimSpace(s)
}

// decodeJSON decodes exactly one JSON value into v. Unknown fields are
// allowed so that a newer service can add some.
func decodeJSON(b []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(b))
	if err := dec.Decode(v); err != nil {
		return err
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return errors.New("trailing data after the JSON value")
	}
	return nil
}

func decodeSelf(b []byte) (Instance, error) {
	var in Instance
	if err := decodeJSON(b, &in); err != nil {
		return Instance{}, err
	}
	if err := in.Validate(); err != nil {
		return Instance{}, err
	}
	return in, nil
}

func decodePeers(b []byte) ([]Instance, error) {
	var ins []Instance
	if err := decodeJSON(b, &ins); err != nil {
		return nil, err
	}
	if ins == nil {
		return nil, errors.New("no peer list")
	}
	if err := CheckInstances(ins); err != nil {
		return nil, err
	}
	return ins, nil
}

func decodeEndpoint(b []byte) (netip.AddrPort, error) {
	var e EndpointAnswer
	if err := decodeJSON(b, &e); err != nil {
		return netip.AddrPort{}, err
	}
	ep, err := netip.ParseAddrPort(e.Endpoint)
	if err != nil {
		return netip.AddrPort{}, fmt.Errorf("invalid endpoint: %w", err)
	}
	if ep.Port() == 0 || ep.Addr().Zone() != "" || ep.Addr().Is4In6() || ep.Addr().IsUnspecified() {
		return netip.AddrPort{}, fmt.Errorf("invalid endpoint %q: want a plain address and a non-zero port", e.Endpoint)
	}
	return ep, nil
}

func decodeInitSecretHash(b []byte) ([]byte, error) {
	var h InitSecretHashAnswer
	if err := decodeJSON(b, &h); err != nil {
		return nil, err
	}
	if _, err := bcrypt.Cost([]byte(h.Hash)); err != nil {
		return nil, fmt.Errorf("not a bcrypt hash: %w", err)
	}
	return []byte(h.Hash), nil
}

// SEVSNPReport asks the local cloud's simulated AMD Secure Processor for
// an SEV-SNP report with reportData, in the kernel's extended report form
// (report, then certificate table). Only a VM whose Self says
// TEESimulatedSEVSNP gets one.
func (c *Client) SEVSNPReport(ctx context.Context, reportData [64]byte) ([]byte, error) {
	path := PathSEVSNPReport + hex.EncodeToString(reportData[:])
	b, err := c.get(ctx, path)
	if err != nil {
		return nil, err
	}
	var a SEVSNPReportAnswer
	if err := decodeJSON(b, &a); err != nil {
		return nil, fmt.Errorf("decode metadata %s: %w", PathSEVSNPReport, err)
	}
	if len(a.Report) == 0 {
		return nil, fmt.Errorf("metadata %s: empty report", PathSEVSNPReport)
	}
	return a.Report, nil
}
