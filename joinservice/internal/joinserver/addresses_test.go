package joinserver

import (
	"context"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/orrery-dev/orrery/internal/attestation/qemu/platformca"
	"github.com/orrery-dev/orrery/internal/attestation/qemu/qemutest"
	"github.com/orrery-dev/orrery/internal/proto/joinpb"
)

// Root on a worker, or the host through the metadata it serves, has the
// joining node state an address that is not a node's: the endpoint's,
// a Service's (10.96.0.1 is the API server's), a pod's. Each is refused,
// saying which address is whose, and nothing is recorded; the node's own
// address still joins.
func TestJoinWithAnAddressThatIsNoNodesRefused(t *testing.T) {
	e := newEnv(t, envOptions{})
	for addr, want := range map[string]string{
		"10.42.1.100": "the cluster's endpoint 10.42.1.100:6443",
		"10.96.0.1":   "in the Service network 10.96.0.0/12",
		"10.244.3.4":  "in the pod network 10.244.0.0/16",
		"10.42.7.7":   "an address of the API server's certificate",
	} {
		resp, err := e.attested.IssueJoinTicket(context.Background(), &joinpb.IssueJoinTicketRequest{NodeAddresses: []string{"10.42.1.0", addr},
			DiskUuid: uuid, CertificateRequest: csr(t, "system:node:"+qemutest.DefaultName, []string{"system:nodes"}),
		})
		if status.Code(err) != codes.PermissionDenied || !strings.Contains(err.Error(), addr+", which is "+want) {
			t.Errorf("a node stating %s: %v, want PermissionDenied saying it is %s", addr, err, want)
		}
		if len(resp.GetKubeletCert()) > 0 || len(resp.GetStateDiskKey()) > 0 {
			t.Fatalf("a node stating %s got a certificate or a disk key", addr)
		}
		if recs, _ := e.admissions.List(context.Background()); len(recs) != 0 {
			t.Fatalf("a node stating %s was recorded: %+v", addr, recs)
		}
	}
	if _, err := e.attested.IssueJoinTicket(context.Background(), &joinpb.IssueJoinTicketRequest{NodeAddresses: nodeAddrs,
		DiskUuid: uuid, CertificateRequest: csr(t, "system:node:"+qemutest.DefaultName, []string{"system:nodes"}),
	}); err != nil {
		t.Fatalf("the node with its own address: %v", err)
	}
}

// A VM that the host named like the API server (a name in its
// certificate) would get a kubelet serving certificate for that name:
// it is refused.
func TestJoinUnderTheAPIServersNameRefused(t *testing.T) {
	for _, name := range []string{"api.example.org", "kubernetes", "kubernetes.default.svc", "kubernetes.default.svc.cluster.local"} {
		t.Run(name, func(t *testing.T) { joinUnderTheAPIServersName(t, name) })
	}
}

func joinUnderTheAPIServersName(t *testing.T, name string) {
	inst := platformca.NewInstance(name)
	e := newEnv(t, envOptions{instance: &inst})
	_, err := e.attested.IssueJoinTicket(context.Background(), &joinpb.IssueJoinTicketRequest{NodeAddresses: nodeAddrs,
		DiskUuid: uuid, CertificateRequest: csr(t, "system:node:"+name, []string{"system:nodes"}),
	})
	if status.Code(err) != codes.PermissionDenied || !strings.Contains(err.Error(), "a name of the cluster's API server") {
		t.Fatalf("a node named %s: %v, want PermissionDenied", name, err)
	}
	if recs, _ := e.admissions.List(context.Background()); len(recs) != 0 {
		t.Fatalf("it was recorded: %+v", recs)
	}
}
