package initserver

import (
	"bytes"
	"errors"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/orrery-dev/orrery/internal/keys"
	"github.com/orrery-dev/orrery/internal/proto/initpb"
	"github.com/orrery-dev/orrery/internal/statuslimit"
)

// FuzzValidate checks that validate accepts only requests within the
// limits and that its error stays small and printable whatever a request
// holds. SANs are given comma-separated. An endpoint it accepts is one
// that can go into kubeadm's YAML and a CoreDNS patch as it is.
func FuzzValidate(f *testing.F) {
	f.Add("demo", "10.42.1.100,api.example.org", "v1.36.3", "10.96.0.0/12", bytes.Repeat([]byte{1}, 32), bytes.Repeat([]byte{3}, 32), "10.42.0.2:6443")
	supported := func(v string) error {
		if v != "v1.36.3" {
			return errors.New("this image ships Kubernetes v1.36.3 only")
		}
		return nil
	}
	f.Fuzz(func(t *testing.T, name, sans, version, cidr string, masterSecret, measurementSalt []byte, endpoint string) {
		req := &initpb.InitRequest{
			MasterSecret:      masterSecret,
			MasterSecretSalt:  bytes.Repeat([]byte{2}, keys.SaltSize),
			MeasurementSalt:   measurementSalt,
			KubernetesVersion: version,
			InitSecret:        []byte(initSecret),
			ClusterName:       name,
			ServiceCidr:       cidr,

			ControlPlaneEndpoint: endpoint,
		}
		if sans != "" {
			req.ApiServerCertSans = strings.Split(sans, ",")
		}
		err := validate(req, supported)
		if err != nil {
			// Invalid UTF-8 quoted by %q is four bytes per byte, so the
			// worst case exceeds statuslimit.MaxMessage a little; Init cuts it.
			if msg := err.Error(); len(msg) > 2*statuslimit.MaxMessage || !utf8.ValidString(msg) {
				t.Fatalf("validate's error has %d bytes or is not UTF-8: %.200q", len(msg), msg)
			}
			return
		}
		if len(name) > maxClusterName || len(version) > maxVersion || len(cidr) > maxServiceCIDR || len(req.ApiServerCertSans) > maxSANs {
			t.Fatalf("validate accepted a request over the limits: name %d, version %d, CIDR %d bytes, %d SANs", len(name), len(version), len(cidr), len(req.ApiServerCertSans))
		}
		for _, san := range req.ApiServerCertSans {
			if len(san) > maxSAN || san == "" {
				t.Fatalf("validate accepted the SAN %.80q (%d bytes)", san, len(san))
			}
		}
		if strings.ContainsFunc(endpoint, func(r rune) bool { return r <= ' ' || r == '"' || r == '\'' || r == '#' || r > '~' }) || len(endpoint) > maxSAN+6 {
			t.Fatalf("validate accepted the endpoint %.80q", endpoint)
		}
	})
}
