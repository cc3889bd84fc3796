package apiserver

import (
	"context"
	"encoding/json"
	"errors"
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

// csrPage is how many requests one answer of List's holds at most, and
// maxCSRAnswer how much of it is read. A kubelet's request object is
// about 2 KiB, so a page is about 100 KiB; but a node's credential may
// create requests as large as the API server stores (etcd takes 1.5 MiB,
// about 2 MiB in JSON), so a page that is longer is asked for again with
// half as many, down to one.
const (
	csrPage      = 50
	maxCSRAnswer = 4 << 20
)

// List calls each with every request to the signer, a page at a time,
// and returns the resource version to watch from. Nodes' credentials may
// create as many requests as they like: no answer holds them all.
func (r SigningRequests) List(ctx context.Context, each func(*certv1.CertificateSigningRequest)) (string, error) {
	limit, next := csrPage, ""
	for {
		q := url.Values{"fieldSelector": {"spec.signerName=" + r.Signer}, "limit": {strconv.Itoa(limit)}}
		if next != "" {
			q.Set("continue", next)
		}
		code, body, err := r.Conn.do(ctx, http.MethodGet, csrPath+"?"+q.Encode(), "", nil, maxCSRAnswer)
		if errors.Is(err, ErrAnswerTooLong) && limit > 1 {
			limit /= 2
			continue
		}
		if err != nil {
			return "", fmt.Errorf("list the certificate signing requests to %s: %w", r.Signer, err)
		}
		if code != http.StatusOK {
			return "", fmt.Errorf("list the certificate signing requests to %s: API server answered %d %s: %s", r.Signer, code, http.StatusText(code), Excerpt(body))
		}
		var l certv1.CertificateSigningRequestList
		if err := json.Unmarshal(body, &l); err != nil {
			return "", fmt.Errorf("decode the certificate signing requests to %s: %w", r.Signer, err)
		}
		for i := range l.Items {
			each(&l.Items[i])
		}
		if next = l.Continue; next == "" {
			return l.ResourceVersion, nil
		}
	}
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
