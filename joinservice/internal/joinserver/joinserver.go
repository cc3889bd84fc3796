// Package joinserver issues join and rejoin tickets to nodes that attested
// over attested TLS: everything a node needs to unlock its state disk and
// run `kubeadm join`. The measurements a node must match are enforced by
// the transport (see internal/atls and joinservice/internal/watchvalidator);
// this package checks the request and assembles the ticket.
package joinserver

import (
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/sha256"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"math/big"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/orrery-dev/orrery/internal/atls"
	"github.com/orrery-dev/orrery/internal/attestation/variant"
	"github.com/orrery-dev/orrery/internal/keys"
	"github.com/orrery-dev/orrery/internal/proto/joinpb"
)

// MaxTokenTTL bounds a bootstrap token's life: long enough for a joining
// node under emulation, short enough to be useless if it leaks.
const MaxTokenTTL = 15 * time.Minute

// MeasurementSecretID is the key service's ID for the measurement secret.
const MeasurementSecretID = "measurement-secret"

// ControlPlaneFiles are the files under the PKI directory a joining
// control-plane node receives (kubeadm's "certificate-key" set).
var ControlPlaneFiles = []string{
	"ca.crt", "ca.key", "sa.key", "sa.pub",
	"front-proxy-ca.crt", "front-proxy-ca.key",
	"etcd/ca.crt", "etcd/ca.key",
}

// KeyClient asks the key service for keys.
type KeyClient interface {
	GetDataKey(ctx context.Context, keyID string, length int) ([]byte, error)
}

// TokenIssuer creates kubeadm bootstrap tokens in the cluster.
type TokenIssuer interface {
	CreateToken(ctx context.Context, ttl time.Duration) (string, error)
}

// Config wires the server.
type Config struct {
	Keys   KeyClient
	Tokens TokenIssuer
	// CA and CAKey are the cluster CA, which signs kubelet certificates.
	CA    *x509.Certificate
	CAKey crypto.Signer
	// PKIDir holds the control-plane files (/etc/kubernetes/pki).
	PKIDir string
	// Endpoint is the API server endpoint, host:port.
	Endpoint          string
	KubernetesVersion string
	Components        []*joinpb.KubernetesComponent
	// MeasurementSalt returns the cluster's measurement salt.
	MeasurementSalt func(ctx context.Context) ([]byte, error)
	// TokenTTL is the bootstrap tokens' lifetime; zero means MaxTokenTTL.
	TokenTTL time.Duration
	// Now is the clock; nil means time.Now.
	Now    func() time.Time
	Logger *slog.Logger
}

// Server implements joinpb.JoinServiceServer.
type Server struct {
	joinpb.UnimplementedJoinServiceServer
	cfg Config
	log *slog.Logger
}

// New returns a join server.
func New(cfg Config) (*Server, error) {
	if cfg.TokenTTL == 0 {
		cfg.TokenTTL = MaxTokenTTL
	}
	if cfg.TokenTTL > MaxTokenTTL {
		return nil, fmt.Errorf("bootstrap token lifetime %s exceeds %s", cfg.TokenTTL, MaxTokenTTL)
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Server{cfg: cfg, log: log.With("component", "joinservice")}, nil
}

// IssueJoinTicket implements joinpb.JoinServiceServer.
func (s *Server) IssueJoinTicket(ctx context.Context, req *joinpb.IssueJoinTicketRequest) (*joinpb.IssueJoinTicketResponse, error) {
	if err := requireAttested(ctx); err != nil {
		return nil, err
	}
	keyID, err := keys.DiskKeyID(req.GetDiskUuid())
	if err != nil {
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	csr, nodeName, err := checkCSR(req.GetCertificateRequest())
	if err != nil {
		return nil, status.Errorf(codes.InvalidArgument, "kubelet certificate request: %v", err)
	}
	log := s.log.With("node", nodeName, "diskUUID", strings.ToLower(req.GetDiskUuid()), "controlPlane", req.GetIsControlPlane())

	diskKey, err := s.cfg.Keys.GetDataKey(ctx, keyID, 32)
	if err != nil {
		log.Error("key service failed", "error", err)
		return nil, status.Errorf(codes.Unavailable, "get the state disk key from the key service: %v", err)
	}
	measurementSecret, err := s.cfg.Keys.GetDataKey(ctx, MeasurementSecretID, 32)
	if err != nil {
		return nil, status.Errorf(codes.Unavailable, "get the measurement secret from the key service: %v", err)
	}
	salt, err := s.cfg.MeasurementSalt(ctx)
	if err != nil {
		return nil, status.Errorf(codes.Unavailable, "read the measurement salt: %v", err)
	}
	cert, err := s.signKubeletCert(csr)
	if err != nil {
		return nil, status.Errorf(codes.Internal, "sign the kubelet certificate: %v", err)
	}
	var files []*joinpb.ControlPlaneFile
	if req.GetIsControlPlane() {
		if files, err = s.controlPlaneFiles(); err != nil {
			log.Error("control-plane files unavailable", "error", err)
			return nil, status.Errorf(codes.Internal, "read control-plane files: %v", err)
		}
	}
	token, err := s.cfg.Tokens.CreateToken(ctx, s.cfg.TokenTTL)
	if err != nil {
		return nil, status.Errorf(codes.Unavailable, "create a bootstrap token: %v", err)
	}
	log.Info("issued join ticket")
	return &joinpb.IssueJoinTicketResponse{
		StateDiskKey:             diskKey,
		MeasurementSalt:          salt,
		MeasurementSecret:        measurementSecret,
		KubeletCert:              cert,
		ApiServerEndpoint:        s.cfg.Endpoint,
		Token:                    token,
		DiscoveryTokenCaCertHash: CAHash(s.cfg.CA),
		ControlPlaneFiles:        files,
		KubernetesVersion:        s.cfg.KubernetesVersion,
		KubernetesComponents:     s.cfg.Components,
	}, nil
}

// IssueRejoinTicket implements joinpb.JoinServiceServer.
func (s *Server) IssueRejoinTicket(ctx context.Context, req *joinpb.IssueRejoinTicketRequest) (*joinpb.IssueRejoinTicketResponse, error) {
	if err := requireAttested(ctx); err != nil {
		return nil, err
	}
	keyID, err := keys.DiskKeyID(req.GetDiskUuid())
	if err != nil {
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	diskKey, err := s.cfg.Keys.GetDataKey(ctx, keyID, 32)
	if err != nil {
		return nil, status.Errorf(codes.Unavailable, "get the state disk key from the key service: %v", err)
	}
	measurementSecret, err := s.cfg.Keys.GetDataKey(ctx, MeasurementSecretID, 32)
	if err != nil {
		return nil, status.Errorf(codes.Unavailable, "get the measurement secret from the key service: %v", err)
	}
	s.log.Info("issued rejoin ticket", "diskUUID", strings.ToLower(req.GetDiskUuid()))
	return &joinpb.IssueRejoinTicketResponse{StateDiskKey: diskKey, MeasurementSecret: measurementSecret}, nil
}

// requireAttested refuses callers that did not attest: the transport should
// never let one through, and a ticket is worth a second check.
func requireAttested(ctx context.Context) error {
	p, ok := peer.FromContext(ctx)
	if !ok {
		return status.Error(codes.PermissionDenied, "caller did not attest")
	}
	info, ok := p.AuthInfo.(atls.AuthInfo)
	if !ok || info.PeerVariant == (variant.Variant{}) {
		return status.Error(codes.PermissionDenied, "caller did not attest")
	}
	return nil
}

// checkCSR parses a kubelet serving CSR and checks it asks for exactly what
// a kubelet should have.
func checkCSR(der []byte) (*x509.CertificateRequest, string, error) {
	if len(der) == 0 {
		return nil, "", errors.New("missing")
	}
	csr, err := x509.ParseCertificateRequest(der)
	if err != nil {
		return nil, "", fmt.Errorf("not a DER PKCS #10 request: %w", err)
	}
	if err := csr.CheckSignature(); err != nil {
		return nil, "", fmt.Errorf("bad signature: %w", err)
	}
	name, ok := strings.CutPrefix(csr.Subject.CommonName, "system:node:")
	if !ok || len(validation.IsDNS1123Subdomain(name)) > 0 {
		return nil, "", fmt.Errorf("common name %q is not system:node:<node name> with a node name Kubernetes accepts (a DNS subdomain)", csr.Subject.CommonName)
	}
	if err := checkKubeletKey(csr.PublicKey); err != nil {
		return nil, "", err
	}
	if !slices.Equal(csr.Subject.Organization, []string{"system:nodes"}) {
		return nil, "", fmt.Errorf("organization %q is not [system:nodes]", csr.Subject.Organization)
	}
	if len(csr.EmailAddresses) > 0 || len(csr.URIs) > 0 {
		return nil, "", errors.New("only DNS names and IP addresses may be requested")
	}
	for _, ext := range csr.Extensions {
		// Only subject alternative names: a CSR must not ask for CA
		// rights or other extensions, which the signer would ignore
		// anyway, but a request for them is a sign of tampering.
		if !ext.Id.Equal([]int{2, 5, 29, 17}) {
			return nil, "", fmt.Errorf("unexpected extension %v", ext.Id)
		}
	}
	return csr, name, nil
}

// checkKubeletKey accepts the keys a kubelet generates and refuses ones too
// weak to serve TLS for years.
func checkKubeletKey(pub any) error {
	switch k := pub.(type) {
	case *ecdsa.PublicKey:
		if k.Curve == elliptic.P256() || k.Curve == elliptic.P384() || k.Curve == elliptic.P521() {
			return nil
		}
		return fmt.Errorf("ECDSA key on curve %s: use P-256, P-384 or P-521", k.Curve.Params().Name)
	case *rsa.PublicKey:
		if k.N.BitLen() >= 2048 {
			return nil
		}
		return fmt.Errorf("RSA key of %d bits: use at least 2048", k.N.BitLen())
	case ed25519.PublicKey:
		return nil
	default:
		return fmt.Errorf("unsupported key type %T: use ECDSA, RSA or Ed25519", pub)
	}
}

func (s *Server) signKubeletCert(csr *x509.CertificateRequest) ([]byte, error) {
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		return nil, err
	}
	now := s.cfg.Now()
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{CommonName: csr.Subject.CommonName, Organization: csr.Subject.Organization},
		DNSNames:     csr.DNSNames,
		IPAddresses:  csr.IPAddresses,
		NotBefore:    now.Add(-5 * time.Minute),
		NotAfter:     now.AddDate(1, 0, 0),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	return x509.CreateCertificate(rand.Reader, tmpl, s.cfg.CA, csr.PublicKey, s.cfg.CAKey)
}

func (s *Server) controlPlaneFiles() ([]*joinpb.ControlPlaneFile, error) {
	var out []*joinpb.ControlPlaneFile
	for _, name := range ControlPlaneFiles {
		data, err := os.ReadFile(filepath.Join(s.cfg.PKIDir, name))
		if err != nil {
			return nil, err
		}
		out = append(out, &joinpb.ControlPlaneFile{Name: name, Data: data})
	}
	return out, nil
}

// CAHash is kubeadm's discovery hash of a CA: SHA-256 over its subject
// public key info.
func CAHash(ca *x509.Certificate) string {
	sum := sha256.Sum256(ca.RawSubjectPublicKeyInfo)
	return "sha256:" + hex.EncodeToString(sum[:])
}
