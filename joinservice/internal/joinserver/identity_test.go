package joinserver

import (
	"context"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/orrery-dev/orrery/internal/attestation"
	"github.com/orrery-dev/orrery/internal/proto/joinpb"
	"github.com/orrery-dev/orrery/internal/records/controlplanes"
)

// The attacks below go through the real transport: a node's swtpm,
// provisioned by a platform CA, attests over attested TLS to a gRPC server
// whose validator trusts that CA; only the request is the attacker's.

// A node with root on itself asks under another node's name: the join
// service must sign nothing for that name.
func TestJoinUnderAnotherNodesNameRefused(t *testing.T) {
	e := newEnv(t, envOptions{})
	for _, claimed := range []string{"worker-1", "cp-0"} {
		t.Run(claimed, func(t *testing.T) {
			resp, err := e.attested.IssueJoinTicket(context.Background(), &joinpb.IssueJoinTicketRequest{NodeAddresses: nodeAddrs,
				DiskUuid: uuid, CertificateRequest: csr(t, "system:node:"+claimed, []string{"system:nodes"}),
			})
			if status.Code(err) != codes.PermissionDenied || !strings.Contains(err.Error(), `names node "`+claimed+`"`) ||
				!strings.Contains(err.Error(), e.node.Instance.ID) {
				t.Fatalf("err = %v, want PermissionDenied naming the claimed node and the attested instance", err)
			}
			if len(resp.GetKubeletCert()) > 0 || len(resp.GetStateDiskKey()) > 0 {
				t.Fatal("a refused request got a certificate or a disk key")
			}
			if !strings.Contains(e.logs.String(), "claimedName="+claimed) {
				t.Errorf("refusal not logged with the claimed name:\n%s", e.logs)
			}
		})
	}
}

// The node's own name still gets its certificate, and the name in it is
// the attested one, whatever names the request adds as SANs.
func TestKubeletCertificateFromAttestedName(t *testing.T) {
	name := "worker-7"
	inst := attestation.Instance{Name: name, ID: "1234567890"}
	e := newEnv(t, envOptions{instance: &inst})
	resp, err := e.attested.IssueJoinTicket(context.Background(), &joinpb.IssueJoinTicketRequest{NodeAddresses: nodeAddrs,
		// csr asks for DNS name worker-0 and IP 10.42.2.100 as SANs.
		DiskUuid: uuid, CertificateRequest: csr(t, "system:node:"+name, []string{"system:nodes"}),
	})
	if err != nil {
		t.Fatal(err)
	}
	checkKubeletCert(t, e.ca, resp.GetKubeletCert(), name)
}

// A worker (its metadata role, or a compromised node's request) asks for
// the control-plane files: it gets nothing, and the refusal is logged.
func TestWorkerAskingForControlPlaneFilesRefused(t *testing.T) {
	e := newEnv(t, envOptions{})
	resp, err := e.attested.IssueJoinTicket(context.Background(), &joinpb.IssueJoinTicketRequest{NodeAddresses: nodeAddrs,
		DiskUuid: uuid, CertificateRequest: csr(t, "system:node:"+e.node.Instance.Name, []string{"system:nodes"}), IsControlPlane: true,
	})
	if status.Code(err) != codes.PermissionDenied || !strings.Contains(err.Error(), "not approved") || !strings.Contains(err.Error(), controlplanes.Key) {
		t.Fatalf("err = %v, want PermissionDenied saying the instance is not approved and where to approve it", err)
	}
	if len(resp.GetControlPlaneFiles()) > 0 || len(resp.GetStateDiskKey()) > 0 {
		t.Fatal("a refused worker got control-plane files or a disk key")
	}
	if logs := e.logs.String(); !strings.Contains(logs, "not an approved control plane") || !strings.Contains(logs, e.node.Instance.ID) {
		t.Errorf("refusal not logged with the instance ID:\n%s", logs)
	}
	// The same node asking as a worker is admitted.
	if _, err := e.attested.IssueJoinTicket(context.Background(), &joinpb.IssueJoinTicketRequest{NodeAddresses: nodeAddrs,
		DiskUuid: uuid, CertificateRequest: csr(t, "system:node:"+e.node.Instance.Name, []string{"system:nodes"}),
	}); err != nil {
		t.Fatalf("as a worker: %v", err)
	}
}

// A VM provisioned before AK certificates named instances cannot be told
// from any other: it is refused, and told to recreate the VM.
func TestJoinWithoutInstanceRefused(t *testing.T) {
	e := newEnv(t, envOptions{instance: &attestation.Instance{}, approveNode: true})
	for _, cp := range []bool{false, true} {
		resp, err := e.attested.IssueJoinTicket(context.Background(), &joinpb.IssueJoinTicketRequest{NodeAddresses: nodeAddrs,
			DiskUuid: uuid, CertificateRequest: csr(t, "system:node:worker-0", []string{"system:nodes"}), IsControlPlane: cp,
		})
		if status.Code(err) != codes.PermissionDenied || !strings.Contains(err.Error(), "names no instance") || !strings.Contains(err.Error(), "recreate the VM") {
			t.Fatalf("control plane %v: err = %v, want PermissionDenied telling to recreate the VM", cp, err)
		}
		if resp != nil {
			t.Fatal("a node without an instance got a ticket")
		}
	}
}

// Disk UUIDs are not secret: another genuine VM that names this node's
// disk gets neither a join nor a rejoin ticket for it.
func TestAnotherVMsDiskRefused(t *testing.T) {
	e := newEnv(t, envOptions{})
	ctx := context.Background()
	if _, err := e.attested.IssueJoinTicket(ctx, &joinpb.IssueJoinTicketRequest{NodeAddresses: nodeAddrs,
		DiskUuid: uuid, CertificateRequest: csr(t, "system:node:worker-0", []string{"system:nodes"}),
	}); err != nil {
		t.Fatal(err)
	}
	join, err := e.other.IssueJoinTicket(ctx, &joinpb.IssueJoinTicketRequest{NodeAddresses: nodeAddrs,
		DiskUuid: uuid, CertificateRequest: csr(t, "system:node:worker-1", []string{"system:nodes"}),
	})
	if status.Code(err) != codes.PermissionDenied || !strings.Contains(err.Error(), "another VM") || len(join.GetStateDiskKey()) > 0 {
		t.Fatalf("join with another VM's disk: err = %v, want PermissionDenied", err)
	}
	rejoin, err := e.other.IssueRejoinTicket(ctx, &joinpb.IssueRejoinTicketRequest{DiskUuid: uuid})
	if status.Code(err) != codes.PermissionDenied || !strings.Contains(err.Error(), "admitted for worker-0") || len(rejoin.GetStateDiskKey()) > 0 {
		t.Fatalf("rejoin with another VM's disk: err = %v, want PermissionDenied naming the disk's VM", err)
	}
	if !strings.Contains(e.logs.String(), "refused a rejoin: the state disk was admitted for another VM") {
		t.Errorf("refusal not logged:\n%s", e.logs)
	}
}

// A rejoin ticket only for a disk the cluster admitted.
func TestRejoinOfUnadmittedDiskRefused(t *testing.T) {
	e := newEnv(t, envOptions{})
	resp, err := e.attested.IssueRejoinTicket(context.Background(), &joinpb.IssueRejoinTicketRequest{DiskUuid: uuid})
	if status.Code(err) != codes.PermissionDenied || !strings.Contains(err.Error(), "never admitted") || len(resp.GetStateDiskKey()) > 0 {
		t.Fatalf("err = %v, want PermissionDenied for a disk never admitted", err)
	}
	// Nor for a node that cannot say which VM it is.
	e2 := newEnv(t, envOptions{instance: &attestation.Instance{}})
	if _, err := e2.attested.IssueRejoinTicket(context.Background(), &joinpb.IssueRejoinTicketRequest{DiskUuid: uuid}); status.Code(err) != codes.PermissionDenied || !strings.Contains(err.Error(), "recreate the VM") {
		t.Fatalf("rejoin without an instance: err = %v", err)
	}
}
