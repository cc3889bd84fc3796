package gcp

import (
	"crypto/x509"
	"embed"
	"encoding/asn1"
	"encoding/pem"
	"errors"
	"fmt"
	"strconv"

	"github.com/orrery-dev/orrery/internal/attestation"
)

// Google's EK/AK certificate authorities for GCE vTPMs (see
// roots/README.md). go-tpm-tools embeds the same ones in its server
// package, which does not build against the go-eventlog this module
// pins.
var (
	//go:embed roots/*.pem
	rootFiles embed.FS

	googleRoots         = mustCerts("roots/tpm-ek-root-1.pem", "roots/gcp-ek-ak-ca-root.pem")
	googleIntermediates = mustCerts("roots/tpm-ek-intermediate-2.pem", "roots/tpm-ek-intermediate-3.pem", "roots/gcp-ek-ak-ca-intermediate-v3.pem")
)

func mustCerts(names ...string) []*x509.Certificate {
	var out []*x509.Certificate
	for _, n := range names {
		b, err := rootFiles.ReadFile(n)
		if err != nil {
			panic(err)
		}
		block, _ := pem.Decode(b)
		if block == nil {
			panic(n + ": no PEM certificate")
		}
		c, err := x509.ParseCertificate(block.Bytes)
		if err != nil {
			panic(fmt.Sprintf("%s: %v", n, err))
		}
		out = append(out, c)
	}
	return out
}

// oidGCEInstance is the extension in which GCE names the VM an AK
// certificate belongs to.
var oidGCEInstance = asn1.ObjectIdentifier{1, 3, 6, 1, 4, 1, 11129, 2, 1, 21}

// gceInstanceInfo is that extension's content, as GCE documents it for
// its Shielded VM identity.
type gceInstanceInfo struct {
	Zone               string `asn1:"utf8"`
	ProjectNumber      int64
	ProjectID          string `asn1:"utf8"`
	InstanceID         int64
	InstanceName       string `asn1:"utf8"`
	SecurityProperties struct {
		SecurityVersion int64 `asn1:"explicit,optional,tag:0"`
		IsProduction    bool  `asn1:"explicit,optional,tag:1"`
	} `asn1:"explicit,optional"`
}

// GCEInstance reads the VM a GCE AK certificate names. A certificate
// without the extension, or of a VM GCE does not mark as production,
// names none.
func GCEInstance(cert *x509.Certificate) (attestation.Instance, error) {
	for _, ext := range cert.Extensions {
		if !ext.Id.Equal(oidGCEInstance) {
			continue
		}
		var info gceInstanceInfo
		rest, err := asn1.Unmarshal(ext.Value, &info)
		if err != nil || len(rest) != 0 {
			return attestation.Instance{}, fmt.Errorf("malformed GCE instance extension: %v", err)
		}
		if !info.SecurityProperties.IsProduction {
			return attestation.Instance{}, nil
		}
		if info.InstanceName == "" || info.InstanceID <= 0 {
			return attestation.Instance{}, errors.New("GCE instance extension without a name or an ID")
		}
		return attestation.Instance{Name: info.InstanceName, ID: strconv.FormatInt(info.InstanceID, 10)}, nil
	}
	return attestation.Instance{}, nil
}
