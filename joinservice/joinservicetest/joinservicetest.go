// Package joinservicetest serves the real join server over attested TLS
// for tests outside the join service, such as the initrd's VM tests: a
// control plane's join service with the cluster's state (keys, admitted
// disks, nodes) held in memory instead of in a key service and the API
// server.
package joinservicetest

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"log/slog"
	"math/big"
	"net"
	"testing"
	"time"

	"google.golang.org/grpc"

	"github.com/orrery-dev/orrery/internal/atls"
	"github.com/orrery-dev/orrery/internal/attestation"
	"github.com/orrery-dev/orrery/internal/attestation/measurements"
	"github.com/orrery-dev/orrery/internal/attestation/policy"
	"github.com/orrery-dev/orrery/internal/attestation/snp"
	"github.com/orrery-dev/orrery/internal/attestation/validator"
	"github.com/orrery-dev/orrery/internal/keys"
	"github.com/orrery-dev/orrery/internal/proto/joinpb"
	"github.com/orrery-dev/orrery/internal/records/admitted"
	"github.com/orrery-dev/orrery/internal/records/measurementset"
	"github.com/orrery-dev/orrery/internal/versions"
	"github.com/orrery-dev/orrery/joinservice/internal/admissions"
	"github.com/orrery-dev/orrery/joinservice/internal/joinserver"
	"github.com/orrery-dev/orrery/joinservice/internal/keyservice"
	"github.com/orrery-dev/orrery/joinservice/internal/setvalidator"
)

// Config is one cluster's join service.
type Config struct {
	// Identity is the service's attestation: that of the control plane
	// it runs on, which joining nodes check. Required.
	Identity attestation.Issuer
	// PlatformCA certifies the attestation keys of the nodes it serves.
	// Required.
	PlatformCA *x509.Certificate
	// Measurements are what nodes must show.
	Measurements measurements.M
	// SEVSNP, if set, is the hardware section of the set: the service
	// then admits gcp-sev-snp nodes.
	SEVSNP *snp.Policy
	// MasterSecret is the cluster's: disk keys and the measurement
	// secret derive from it.
	MasterSecret    keys.MasterSecret
	MeasurementSalt []byte
	// Admitted are the state disks the cluster admitted (LUKS UUIDs) and
	// the VM each was admitted for.
	Admitted map[string]attestation.Instance
	// ControlPlanes are the instance IDs the owner approved as control
	// planes: their rejoin tickets say they are one. Nil approves none.
	ControlPlanes []string
	// KubernetesVersion is the version the cluster runs, as its tickets
	// say; "" is versions.Default.
	KubernetesVersion string
	Logger            *slog.Logger
}

// Serve serves the join service on a loopback port until the test ends
// and returns its address.
func Serve(tb testing.TB, cfg Config) string {
	tb.Helper()
	ca, caKey := clusterCA(tb)
	adm := &admissions.Memory{}
	for disk, inst := range cfg.Admitted {
		if err := adm.Admit(context.Background(), admitted.Record{DiskUUID: disk, Instance: inst}); err != nil {
			tb.Fatal(err)
		}
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	// The join service's own validator, over one accepted set: the
	// rules it adds to every set (PCR 15) hold here too.
	set, err := measurementset.FromPolicy(policy.Policy{PCRs: cfg.Measurements, SEVSNP: cfg.SEVSNP}, "joinservicetest")
	if err != nil {
		tb.Fatal(err)
	}
	val, err := setvalidator.New(setvalidator.Config{
		Variant: set.Policy().Variant(),
		Build: func(p policy.Policy) (attestation.Validator, error) {
			return validator.New(validator.Config{Policy: p, PlatformCAs: []*x509.Certificate{cfg.PlatformCA}, Logger: log})
		},
		Source: func(context.Context) ([]measurementset.Set, error) { return []measurementset.Set{set}, nil },
		Logger: log,
	})
	if err != nil {
		tb.Fatal(err)
	}
	srv, err := joinserver.New(joinserver.Config{
		Keys: masterKeys{cfg.MasterSecret}, Admissions: adm, Nodes: allNodes{}, CA: ca, CAKey: caKey,
		PKIDir: tb.TempDir(), Endpoint: "127.0.0.1:6443",
		ClusterVersion: func(context.Context) (string, error) {
			if cfg.KubernetesVersion == "" {
				return versions.Default, nil
			}
			return cfg.KubernetesVersion, nil
		},
		MeasurementSalt: func(context.Context) ([]byte, error) { return cfg.MeasurementSalt, nil },
		ControlPlanes:   func(context.Context) ([]string, error) { return cfg.ControlPlanes, nil },
		CurrentSet:      val.Current,
		Logger:          log,
	})
	if err != nil {
		tb.Fatal(err)
	}
	creds, err := atls.NewCredentials(atls.Config{Issuer: cfg.Identity, Validators: []attestation.Validator{val}})
	if err != nil {
		tb.Fatal(err)
	}
	g := grpc.NewServer(grpc.Creds(creds))
	joinpb.RegisterJoinServiceServer(g, srv)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	go g.Serve(lis)
	tb.Cleanup(g.Stop)
	return lis.Addr().String()
}

// masterKeys is the key service of a cluster with this master secret.
type masterKeys struct{ ms keys.MasterSecret }

func (k masterKeys) GetDataKey(_ context.Context, id string, n int) ([]byte, error) {
	return keyservice.Derive(k.ms, id, n)
}

// allNodes is a cluster from which the owner removed no node.
type allNodes struct{}

func (allNodes) NodeExists(context.Context, string) (bool, error) { return true, nil }

func clusterCA(tb testing.TB) (*x509.Certificate, *ecdsa.PrivateKey) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		tb.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "kubernetes"}, IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageCertSign, NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour)}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		tb.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		tb.Fatal(err)
	}
	return cert, key
}
