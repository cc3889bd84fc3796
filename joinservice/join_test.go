package main

import (
	"context"
	"crypto/x509"
	"errors"
	"io"
	"log/slog"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/google/go-tpm-tools/client"
	"github.com/google/go-tpm/legacy/tpm2"
	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/orrery-dev/orrery/internal/atls"
	"github.com/orrery-dev/orrery/internal/attestation"
	"github.com/orrery-dev/orrery/internal/attestation/measurements"
	"github.com/orrery-dev/orrery/internal/attestation/nodeattest"
	"github.com/orrery-dev/orrery/internal/attestation/qemu"
	"github.com/orrery-dev/orrery/internal/attestation/qemu/qemutest"
	"github.com/orrery-dev/orrery/internal/attestation/variant"
	"github.com/orrery-dev/orrery/internal/tpm/swtpm/swtpmtest"
)

// sameImage expects n's PCRs 4, 9 and 11 and a non-zero PCR 15: what a
// joining node of n's image requires of its join service.
func sameImage(t *testing.T, n *qemutest.Node) attestation.Validator {
	return validatorOf(t, n, []int{4, 9, 11}, []uint32{15})
}

// unlocked expects n's PCRs 4, 9, 11 and a zero PCR 15: what the join
// service requires of a node that joins for the first time.
func unlocked(t *testing.T, n *qemutest.Node) attestation.Validator {
	return validatorOf(t, n, []int{4, 9, 11, 15}, nil)
}

func validatorOf(t *testing.T, n *qemutest.Node, pcrs []int, nonZero []uint32) attestation.Validator {
	rw := swtpmtest.Open(t, n.TPM)
	values, err := client.ReadPCRs(rw, tpm2.PCRSelection{Hash: tpm2.AlgSHA256, PCRs: pcrs})
	rw.Close()
	if err != nil {
		t.Fatal(err)
	}
	m := measurements.M{}
	for pcr, v := range values.GetPcrs() {
		m[pcr] = measurements.Measurement{Expected: v}
	}
	v, err := qemu.NewValidator(qemu.ValidatorConfig{Measurements: m, PlatformCAs: []*x509.Certificate{n.CA.Cert}, NonZero: nonZero})
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// The join service attests with its control-plane node's vTPM, and still
// requires the joining node to attest.
func TestJoinServiceAttests(t *testing.T) {
	cp := qemutest.NewNode(t)
	cp.Measure(t, 11, "enter-initrd", "initrd: enter-initrd")
	cp.Measure(t, 15, "cluster ID", "node lock: cluster ID")
	issuer, err := nodeIssuer(qemu.IssuerConfig{OpenTPM: cp.TPM.Open, MeasurementLog: cp.Log}, nodeattest.Platform{Variant: variant.QEMUVTPM})
	if err != nil {
		t.Fatal(err)
	}
	joining := qemutest.NewNodeOf(t, cp.CA)
	joining.Measure(t, 11, "enter-initrd", "initrd: enter-initrd")
	creds, err := serverCredentials(issuer, []attestation.Validator{unlocked(t, joining)}, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer(grpc.Creds(creds))
	healthpb.RegisterHealthServer(srv, health.NewServer())
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(lis)
	defer srv.Stop()

	check := func(cfg atls.Config) error {
		c, err := atls.NewCredentials(cfg)
		if err != nil {
			t.Fatal(err)
		}
		conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(c))
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		_, err = healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{})
		return err
	}
	if err := check(atls.Config{Issuer: joining.Issuer, Validators: []attestation.Validator{sameImage(t, joining)}}); err != nil {
		t.Fatalf("a joining node of the same image refused the join service, or was refused: %v", err)
	}
	if err := check(atls.Config{Validators: []attestation.Validator{sameImage(t, joining)}}); err == nil || !strings.Contains(err.Error(), "requires clients to attest") {
		t.Fatalf("a client that does not attest: err = %v, want a refusal", err)
	}
}

func TestJoinServiceWithoutFirmwareLogSaysWhy(t *testing.T) {
	cp := qemutest.NewNode(t)
	_, err := nodeIssuer(qemu.IssuerConfig{OpenTPM: cp.TPM.Open, MeasurementLog: cp.Log, FirmwareEventLogPath: "/nonexistent/binary_bios_measurements"}, nodeattest.Platform{Variant: variant.QEMUVTPM})
	if err == nil || !strings.Contains(err.Error(), "firmware event log") {
		t.Fatalf("err = %v, want it to name the missing firmware event log", err)
	}
}

func TestJoinServiceWithoutTPMSaysWhy(t *testing.T) {
	_, err := nodeIssuer(qemu.IssuerConfig{OpenTPM: func() (io.ReadWriteCloser, error) { return nil, errors.New("no such device") }}, nodeattest.Platform{Variant: variant.QEMUVTPM})
	if err == nil || !strings.Contains(err.Error(), "/dev/tpmrm0") {
		t.Fatalf("err = %v, want it to name the device the pod needs", err)
	}
}
