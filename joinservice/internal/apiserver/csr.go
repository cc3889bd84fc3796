package apiserver

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"strconv"

	certv1 "k8s.io/api/certificates/v1"
)

const csrPath = "/apis/certificates.k8s.io/v1/certificatesigningrequests"

// SigningRequests are the cluster's certificate signing requests to one
// signer, as servingcsr.Approver reads and decides them.
type SigningRequests struct {
	Conn   *Conn
	Signer string
}

// List returns the requests to the signer, and the resource version to
// watch from.
func (r SigningRequests) List(ctx context.Context) ([]certv1.CertificateSigningRequest, string, error) {
	q := url.Values{"fieldSelector": {"spec.signerName=" + r.Signer}}
	code, body, err := r.Conn.Do(ctx, http.MethodGet, csrPath+"?"+q.Encode(), nil)
	if err != nil {
		return nil, "", fmt.Errorf("list the certificate signing requests to %s: %w", r.Signer, err)
	}
	if code != http.StatusOK {
		return nil, "", fmt.Errorf("list the certificate signing requests to %s: API server answered %d %s: %s", r.Signer, code, http.StatusText(code), Excerpt(body))
	}
	var l certv1.CertificateSigningRequestList
	if err := json.Unmarshal(body, &l); err != nil {
		return nil, "", fmt.Errorf("decode the certificate signing requests to %s (a list longer than %d bytes is cut): %w", r.Signer, maxResponse, err)
	}
	return l.Items, l.ResourceVersion, nil
}

// watchSeconds is how long one watch of the requests lasts before the
// API server ends it and the approver lists them again.
const watchSeconds = 300

// Watch calls changed with every request to the signer that is added or
// changed after resourceVersion, until ctx ends or the API server ends
// the watch (after watchSeconds); ErrWatchExpired says to list again.
func (r SigningRequests) Watch(ctx context.Context, resourceVersion string, changed func(*certv1.CertificateSigningRequest)) error {
	q := url.Values{"fieldSelector": {"spec.signerName=" + r.Signer}, "watch": {"1"},
		"resourceVersion": {resourceVersion}, "timeoutSeconds": {strconv.Itoa(watchSeconds)}}
	err := r.Conn.Watch(ctx, csrPath+"?"+q.Encode(), func(e Event) error {
		if e.Type != "ADDED" && e.Type != "MODIFIED" {
			return nil
		}
		var csr certv1.CertificateSigningRequest
		if err := json.Unmarshal(e.Object, &csr); err != nil {
			return fmt.Errorf("decode a certificate signing request to %s: %w", r.Signer, err)
		}
		changed(&csr)
		return nil
	})
	if err != nil {
		return fmt.Errorf("watch the certificate signing requests to %s: %w", r.Signer, err)
	}
	return nil
}

// UpdateApproval writes csr's conditions through its approval
// subresource; the API server refuses it (409) if csr changed since it
// was read.
func (r SigningRequests) UpdateApproval(ctx context.Context, csr *certv1.CertificateSigningRequest) error {
	csr = csr.DeepCopy()
	csr.APIVersion, csr.Kind = certv1.SchemeGroupVersion.String(), "CertificateSigningRequest"
	code, body, err := r.Conn.Do(ctx, http.MethodPut, csrPath+"/"+url.PathEscape(csr.Name)+"/approval", csr)
	if err != nil {
		return fmt.Errorf("decide certificate signing request %s: %w", csr.Name, err)
	}
	if code != http.StatusOK {
		return fmt.Errorf("decide certificate signing request %s: API server answered %d %s: %s", csr.Name, code, http.StatusText(code), Excerpt(body))
	}
	return nil
}
