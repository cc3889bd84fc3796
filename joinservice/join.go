package main

import (
	"bytes"
	"context"
	"crypto"
	"crypto/x509"
	"encoding/base64"
	"encoding/pem"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/keepalive"

	"github.com/orrery-dev/orrery/internal/atls"
	"github.com/orrery-dev/orrery/internal/attestation"
	"github.com/orrery-dev/orrery/internal/attestation/nodeattest"
	"github.com/orrery-dev/orrery/internal/attestation/policy"
	"github.com/orrery-dev/orrery/internal/attestation/qemu"
	"github.com/orrery-dev/orrery/internal/attestation/qemu/platformca"
	"github.com/orrery-dev/orrery/internal/attestation/validator"
	"github.com/orrery-dev/orrery/internal/attestation/variant"
	"github.com/orrery-dev/orrery/internal/logging"
	"github.com/orrery-dev/orrery/internal/metadata"
	"github.com/orrery-dev/orrery/internal/proto/joinpb"
	"github.com/orrery-dev/orrery/internal/records/controlplanes"
	"github.com/orrery-dev/orrery/internal/servingcsr"
	"github.com/orrery-dev/orrery/joinservice/internal/admissions"
	"github.com/orrery-dev/orrery/joinservice/internal/apiserver"
	"github.com/orrery-dev/orrery/joinservice/internal/joinserver"
	"github.com/orrery-dev/orrery/joinservice/internal/setvalidator"
)

// joinFlags are the join service's settings.
type joinFlags struct {
	listen, keys, platformCA, pki, salt, controlPlanes string
	snpCollateral, metadataURL                         string
	measurementLog, firmwareLog, endpoint              string
	level                                              logging.Level
}

func parseJoinFlags(args []string) joinFlags {
	var f joinFlags
	fs := flag.NewFlagSet("joinservice join", flag.ExitOnError)
	fs.StringVar(&f.listen, "listen", fmt.Sprintf(":%d", joinpb.Port), "address to serve attested TLS on")
	fs.StringVar(&f.keys, "key-service", DefaultKeyServiceSocket, "unix socket of the key service beside this one")
	fs.StringVar(&f.platformCA, "platform-ca", "/etc/orrery/platform-ca/platform-ca.crt", "CA that certifies the nodes' attestation keys")
	fs.StringVar(&f.snpCollateral, "snp-collateral", "", "directory of AMD KDS collateral (CRLs) for SEV-SNP sets under AMD's roots, laid out as snp.CollateralDir says; a set's test root brings its own CRL")
	fs.StringVar(&f.metadataURL, "metadata-url", metadata.DefaultBaseURL, "the cloud's metadata service, which says whether this control plane is a simulated SEV-SNP VM (the pod runs in the host's network)")
	fs.StringVar(&f.pki, "pki-dir", "/etc/kubernetes/pki", "the cluster's PKI (host path)")
	fs.StringVar(&f.salt, "measurement-salt", "/etc/orrery/join-config/measurementSalt", "base64 measurement salt (the orrery-join-config ConfigMap)")
	fs.StringVar(&f.controlPlanes, "control-planes", "/etc/orrery/join-config/"+controlplanes.Key, "instance IDs the owner approved as control planes (a key of the orrery-join-config ConfigMap; re-read on every request; missing means none)")
	node := qemu.NodeIssuerConfig()
	fs.StringVar(&f.measurementLog, "measurement-log", node.MeasurementLog.Path, "this control-plane node's userspace measurement log (a read-only host path)")
	fs.StringVar(&f.firmwareLog, "firmware-event-log", node.FirmwareEventLogPath, "this control-plane node's firmware event log (a read-only host path; missing means none)")
	fs.StringVar(&f.endpoint, "endpoint", "", "API server endpoint handed to joining nodes, host:port")
	logging.AddLevelFlag(fs, &f.level)
	_ = fs.Parse(args)
	return f
}

func runJoin(ctx context.Context, args []string) error {
	f := parseJoinFlags(args)
	log := logging.New(logging.Config{Program: "joinservice", Format: logging.JSON, Level: f.level, Output: os.Stderr})
	if f.endpoint == "" {
		return errors.New("--endpoint is required (the API server's host:port)")
	}
	ca, err := platformca.LoadCert(f.platformCA)
	if err != nil {
		return fmt.Errorf("load the platform CA: %w", err)
	}
	api, err := apiserver.InCluster()
	if err != nil {
		return fmt.Errorf("connect to the API server: %w", err)
	}
	validators, err := setValidators(ca, f.snpCollateral, api.MeasurementSets, log)
	if err != nil {
		return err
	}
	js, err := newJoinServer(f, api, setvalidator.CurrentOfAny(validators...), log)
	if err != nil {
		return err
	}
	node := qemu.NodeIssuerConfig()
	node.MeasurementLog.Path, node.FirmwareEventLogPath = f.measurementLog, f.firmwareLog
	node.Logger = log
	platform, err := nodeattest.Detect(ctx, &metadata.Client{BaseURL: f.metadataURL})
	if err != nil {
		return fmt.Errorf("tell which attestation this control plane's platform offers: %w", err)
	}
	log.Info("attesting as "+platform.Variant.String(), "simulated", platform.Simulated)
	issuer, err := nodeIssuer(node, platform)
	if err != nil {
		return fmt.Errorf("set up this node's attestation: %w", err)
	}
	var vs []attestation.Validator
	for _, v := range validators {
		vs = append(vs, timedValidator{ProofValidator: v, log: log})
	}
	creds, err := serverCredentials(issuer, vs, log)
	if err != nil {
		return fmt.Errorf("set up attested TLS: %w", err)
	}
	lis, err := (&net.ListenConfig{}).Listen(ctx, "tcp", f.listen)
	if err != nil {
		return fmt.Errorf("listen on %s: %w", f.listen, err)
	}
	srv := grpc.NewServer(grpc.Creds(creds),
		// Each ticket re-checks the connection's attestation
		// (setvalidator.Validator.Current refuses one older than
		// DefaultMaxAge); closing such connections as well spares the
		// service peers that hold them open.
		grpc.KeepaliveParams(keepalive.ServerParameters{MaxConnectionAge: setvalidator.DefaultMaxAge, MaxConnectionAgeGrace: time.Minute}),
		// A ticket request is a disk UUID and a CSR: a few hundred
		// bytes. Peers attested before they send one, and still get
		// no more than this.
		grpc.MaxRecvMsgSize(64<<10),
		grpc.InitialWindowSize(64<<10), grpc.InitialConnWindowSize(64<<10),
		grpc.MaxHeaderListSize(16<<10))
	joinpb.RegisterJoinServiceServer(srv, js)
	go func() { <-ctx.Done(); srv.GracefulStop() }()
	go func() {
		if err := servingApprover(api, log).Run(ctx); err != nil {
			log.Error("the kubelets' serving certificates are not approved", "error", err.Error())
		}
	}()
	log.Info("join service listening", "addr", lis.Addr().String())
	return srv.Serve(lis)
}

// servingApprover decides kubelets' requests for serving certificates
// from the cluster's record of admitted nodes (internal/servingcsr): a
// kubelet gets one for its own name and the addresses it was admitted
// with, and the API server (--kubelet-certificate-authority) takes no
// other for it. It runs beside the join service because the join
// service writes those records.
func servingApprover(api *apiserver.Conn, log *slog.Logger) *servingcsr.Approver {
	store := &admissions.Store{Conn: api}
	return &servingcsr.Approver{
		Requests: apiserver.SigningRequests{Conn: api, Signer: servingcsr.Signer},
		Lookup: func(ctx context.Context, name string) (servingcsr.Admitted, bool, error) {
			recs, err := store.List(ctx)
			if err != nil {
				return servingcsr.Admitted{}, false, err
			}
			a, ok := servingcsr.FromRecords(recs, name)
			return a, ok, nil
		},
		Log: log.With("component", "servingcsr"),
	}
}

// newJoinServer builds the join server: the cluster CA that signs node
// certificates, the key service, the cluster's Kubernetes version, and the
// record of admitted nodes in the cluster.
func newJoinServer(f joinFlags, api *apiserver.Conn, currentSet func(context.Context, []byte) (string, error), log *slog.Logger) (*joinserver.Server, error) {
	clusterCA, clusterKey, err := loadClusterCA(f.pki)
	if err != nil {
		return nil, fmt.Errorf("load the cluster CA: %w", err)
	}
	kc, err := dialKeys(f.keys)
	if err != nil {
		return nil, fmt.Errorf("connect to the key service: %w", err)
	}
	js, err := joinserver.New(joinserver.Config{
		Keys: kc, Admissions: &admissions.Store{Conn: api}, Nodes: api, Removed: api.RemovedNodes, CurrentSet: currentSet, CA: clusterCA, CAKey: clusterKey, PKIDir: f.pki,
		Endpoint: f.endpoint, ClusterVersion: api.KubernetesVersion, ControlPlaneVersions: api.ControlPlaneVersions, Reserved: reserved(api),
		MeasurementSalt: func(context.Context) ([]byte, error) { return readSalt(f.salt) },
		ControlPlanes:   func(context.Context) ([]string, error) { return readControlPlanes(f.controlPlanes) },
		Logger:          log,
	})
	if err != nil {
		return nil, fmt.Errorf("set up the join server: %w", err)
	}
	return js, nil
}

// nodeIssuer is the join service's attestation: it quotes on the vTPM of
// the control-plane node it runs on, with that node's logs. It fails at
// start, not at a joining node's first handshake, if the TPM cannot be
// opened or a log is not there: the issuer would quote without a missing
// log, and joining nodes would refuse the service because its logs do not
// replay to its PCRs (the UKI's measurements into PCR 11 are in the
// firmware's log).
func nodeIssuer(cfg qemu.IssuerConfig, platform nodeattest.Platform) (attestation.Issuer, error) {
	// In a fixed order, so that the same missing files always give the
	// same error (a map's order made a test fail now and then).
	logs := [][2]string{{"firmware event log", cfg.FirmwareEventLogPath}}
	if cfg.MeasurementLog != nil {
		logs = append(logs, [2]string{"measurement log", cfg.MeasurementLog.Path})
	}
	for _, l := range logs {
		what, path := l[0], l[1]
		if path == "" {
			continue
		}
		if _, err := os.Stat(path); err != nil {
			return nil, fmt.Errorf("the join service attests with its control-plane node's %s, and cannot find it (the orrery-services chart mounts it from the node; an empty flag means none): %w", what, err)
		}
	}
	rw, err := cfg.OpenTPM()
	if err != nil {
		return nil, fmt.Errorf("the join service attests with its control-plane node's vTPM, and cannot open it (its container needs /dev/tpmrm0: see the orrery-services chart): %w", err)
	}
	rw.Close()
	return platform.Issuer(cfg)
}

// serverCredentials are the join service's attested TLS: both sides
// attest. The join service proves first that it is a control plane of
// the image the joining node runs (locked to a cluster), and joining nodes
// use nothing it sends otherwise (bootstrapperd/internal/joinclient); then
// the node proves it runs an image of the accepted measurements.
func serverCredentials(issuer attestation.Issuer, validators []attestation.Validator, log *slog.Logger) (credentials.TransportCredentials, error) {
	return atls.NewCredentials(atls.Config{
		Issuer:     issuer,
		Validators: validators,
		// One quote at a time, the default, said here because it matters:
		// under TCG a quote takes seconds, and a burst of joining nodes
		// waits its turn (within the handshake timeout, then retries with
		// backoff) rather than piling TPM commands onto the control
		// plane's vTPM.
		MaxConcurrentQuotes: 1,
		// The error names each PCR that differs and what the node's logs
		// say was measured into it.
		OnPeerRejected: func(peer net.Addr, err error) {
			log.Warn("refused a node: its attestation does not match the cluster's measurements", "peer", peer.String(), "error", err.Error())
		},
	})
}

// setValidators admits nodes of every variant against the cluster's sets
// of that variant: a set's hardware section (none, SEV-SNP or TDX)
// decides which nodes it admits. Each set's validator is built from the
// set's policy with PCR 15 required zero (setvalidator.JoinPolicy).
func setValidators(ca *x509.Certificate, snpCollateral string, source setvalidator.Source, log *slog.Logger) ([]*setvalidator.Validator, error) {
	var out []*setvalidator.Validator
	for _, v := range []variant.Variant{variant.QEMUVTPM, variant.GCPSEVSNP, variant.GCPTDX} {
		sv, err := setvalidator.New(setvalidator.Config{
			Variant: v,
			Build: func(p policy.Policy) (attestation.Validator, error) {
				return validator.New(validator.Config{Policy: p, PlatformCAs: []*x509.Certificate{ca}, Collateral: validator.Dirs(snpCollateral, ""), Logger: log})
			},
			Source: source,
			Logger: log,
		})
		if err != nil {
			return nil, err
		}
		out = append(out, sv)
	}
	return out, nil
}

func readSalt(path string) ([]byte, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	return base64.StdEncoding.DecodeString(string(bytes.TrimSpace(raw)))
}

// readControlPlanes reads the owner's approved control-plane instance IDs.
// A missing file (the ConfigMap has no such key) approves none.
func readControlPlanes(path string) ([]string, error) {
	raw, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	return controlplanes.Parse(string(raw))
}

func loadClusterCA(dir string) (*x509.Certificate, crypto.Signer, error) {
	certPEM, err := os.ReadFile(filepath.Join(dir, "ca.crt"))
	if err != nil {
		return nil, nil, fmt.Errorf("read cluster CA: %w", err)
	}
	keyPEM, err := os.ReadFile(filepath.Join(dir, "ca.key"))
	if err != nil {
		return nil, nil, fmt.Errorf("read cluster CA key: %w", err)
	}
	cb, _ := pem.Decode(certPEM)
	kb, _ := pem.Decode(keyPEM)
	if cb == nil || kb == nil {
		return nil, nil, fmt.Errorf("cluster CA files in %s are not PEM", dir)
	}
	cert, err := x509.ParseCertificate(cb.Bytes)
	if err != nil {
		return nil, nil, err
	}
	var key any
	switch kb.Type {
	case "RSA PRIVATE KEY":
		key, err = x509.ParsePKCS1PrivateKey(kb.Bytes)
	case "EC PRIVATE KEY":
		key, err = x509.ParseECPrivateKey(kb.Bytes)
	default:
		key, err = x509.ParsePKCS8PrivateKey(kb.Bytes)
	}
	if err != nil {
		return nil, nil, fmt.Errorf("parse cluster CA key: %w", err)
	}
	signer, ok := key.(crypto.Signer)
	if !ok {
		return nil, nil, errors.New("cluster CA key cannot sign")
	}
	return cert, signer, nil
}

// reserved is what no joining node may state as its address or take as
// its name: the cluster's Service and pod networks, and the names and
// addresses of the API server's certificate.
func reserved(api *apiserver.Conn) func(context.Context) (joinserver.Reserved, error) {
	return func(ctx context.Context) (joinserver.Reserved, error) {
		services, pods, sans, err := api.ClusterNetworks(ctx)
		if err != nil {
			return joinserver.Reserved{}, err
		}
		var r joinserver.Reserved
		for _, p := range services {
			r.Networks = append(r.Networks, joinserver.Network{Name: "the cluster's Service network", Prefix: p})
		}
		for _, p := range pods {
			r.Networks = append(r.Networks, joinserver.Network{Name: "the cluster's pod network", Prefix: p})
		}
		for _, san := range sans {
			if a, err := netip.ParseAddr(san); err == nil {
				r.Networks = append(r.Networks, joinserver.Network{Name: "an address of the API server's certificate", Prefix: netip.PrefixFrom(a.Unmap(), a.Unmap().BitLen())})
			} else {
				r.Names = append(r.Names, san)
			}
		}
		return r, nil
	}
}
