package atls_test

import (
	"crypto/x509"
	"io"
	"log"
	"net"
	"os"

	"google.golang.org/grpc"

	"github.com/orrery-dev/orrery/internal/atls"
	"github.com/orrery-dev/orrery/internal/attestation"
	"github.com/orrery-dev/orrery/internal/attestation/measurements"
	"github.com/orrery-dev/orrery/internal/attestation/qemu"
	"github.com/orrery-dev/orrery/internal/attestation/qemu/platformca"
	"github.com/orrery-dev/orrery/internal/tpm/pcrlog"
)

// A node serves gRPC over attested TLS; the owner's tool connects and
// requires the node's attestation to match the image's measurements.
func Example() {
	// On the node.
	issuer, err := qemu.NewIssuer(qemu.IssuerConfig{
		OpenTPM:        openTPM,
		MeasurementLog: &pcrlog.Log{Path: pcrlog.DefaultPath},
	})
	if err != nil {
		log.Fatal(err)
	}
	serverCreds, err := atls.NewCredentials(atls.Config{Issuer: issuer})
	if err != nil {
		log.Fatal(err)
	}
	srv := grpc.NewServer(grpc.Creds(serverCreds))
	lis, err := net.Listen("tcp", ":9000")
	if err != nil {
		log.Fatal(err)
	}
	go srv.Serve(lis)

	// On the owner's workstation.
	m, err := measurements.Load("build/image/measurements.json")
	if err != nil {
		log.Fatal(err)
	}
	ca, err := platformca.LoadCert("orrery-mini/platform-ca.crt")
	if err != nil {
		log.Fatal(err)
	}
	validator, err := qemu.NewValidator(qemu.ValidatorConfig{Measurements: m, PlatformCAs: []*x509.Certificate{ca}})
	if err != nil {
		log.Fatal(err)
	}
	clientCreds, err := atls.NewCredentials(atls.Config{Validators: []attestation.Validator{validator}})
	if err != nil {
		log.Fatal(err)
	}
	conn, err := grpc.NewClient("10.42.1.100:9000", grpc.WithTransportCredentials(clientCreds))
	if err != nil {
		log.Fatal(err)
	}
	defer conn.Close()
	// RPCs on conn reach only a node whose attestation passed.
}

// openTPM opens the kernel's TPM resource manager on a node.
func openTPM() (io.ReadWriteCloser, error) { return os.OpenFile("/dev/tpmrm0", os.O_RDWR, 0) }
