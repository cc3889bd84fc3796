package joinserver

import (
	"context"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/orrery-dev/orrery/internal/proto/joinpb"
	"github.com/orrery-dev/orrery/internal/records/measurementset"
	"github.com/orrery-dev/orrery/joinservice/internal/setvalidator"
)

// A connection's attestation is checked again before every ticket: a node
// whose image the owner retired after its handshake, or whose connection
// attested too long ago, gets no ticket on that connection, and is told
// what to do.
func TestTicketOnConnectionNoLongerAdmitted(t *testing.T) {
	tests := map[string]struct {
		// then happens between the node's first ticket and its next
		// request on the same connection.
		then    func(t *testing.T, e *env)
		wantMsg []string
	}{
		"set still accepted": {
			then: func(_ *testing.T, e *env) { e.sets.change(nil, time.Minute) },
		},
		"set retired": {
			then: func(t *testing.T, e *env) {
				e.sets.change([]measurementset.Set{imageSet(t, 0xb)}, setvalidator.DefaultRefresh)
			},
			wantMsg: []string{"the owner retired measurement set image-", "upgrade this node", "reconnect"},
		},
		"attested longer ago than the maximum age": {
			then:    func(_ *testing.T, e *env) { e.sets.change(nil, setvalidator.DefaultMaxAge+time.Minute) },
			wantMsg: []string{"attested 11m0s ago", "reconnect"},
		},
	}
	requests := map[string]func(t *testing.T, e *env) (diskKey []byte, err error){
		"join": func(t *testing.T, e *env) ([]byte, error) {
			resp, err := e.attested.IssueJoinTicket(context.Background(), &joinpb.IssueJoinTicketRequest{NodeAddresses: nodeAddrs,
				DiskUuid: uuid, CertificateRequest: csr(t, "system:node:worker-0", []string{"system:nodes"}),
			})
			return resp.GetStateDiskKey(), err
		},
		"rejoin": func(_ *testing.T, e *env) ([]byte, error) {
			resp, err := e.attested.IssueRejoinTicket(context.Background(), &joinpb.IssueRejoinTicketRequest{DiskUuid: uuid})
			return resp.GetStateDiskKey(), err
		},
	}
	for name, tc := range tests {
		for rpc, request := range requests {
			t.Run(name+"/"+rpc, func(t *testing.T) {
				e := newEnv(t, envOptions{})
				if _, err := requests["join"](t, e); err != nil {
					t.Fatal(err)
				}
				if got := e.admissions.Set(uuid); got != e.imageA {
					t.Fatalf("admitted with set %q, want %q", got, e.imageA)
				}
				tc.then(t, e)
				key, err := request(t, e)
				if tc.wantMsg == nil {
					if err != nil || len(key) == 0 {
						t.Fatalf("err = %v, want a ticket", err)
					}
					return
				}
				// PermissionDenied, not a failed handshake: the request
				// came on the connection that attested before.
				if status.Code(err) != codes.PermissionDenied || len(key) > 0 {
					t.Fatalf("err = %v, want PermissionDenied and no disk key", err)
				}
				for _, want := range tc.wantMsg {
					if !strings.Contains(err.Error(), want) {
						t.Errorf("err = %v, want it to say %q", err, want)
					}
				}
				if !strings.Contains(e.logs.String(), "refused a "+rpc+": the connection's attestation no longer admits the node") {
					t.Errorf("refusal not logged:\n%s", e.logs)
				}
			})
		}
	}
}

// The cluster's set says nothing of PCR 15 (imageSet); a VM of that image
// that has locked itself to a cluster since it booted (it opened some
// cluster's state disk) still gets neither a join nor a rejoin ticket.
func TestLockedNodeRefused(t *testing.T) {
	e := newEnv(t, envOptions{})
	e.node.Lock(t, "another cluster")
	join, err := e.attested.IssueJoinTicket(context.Background(), &joinpb.IssueJoinTicketRequest{NodeAddresses: nodeAddrs,
		DiskUuid: uuid, CertificateRequest: csr(t, "system:node:worker-0", []string{"system:nodes"}),
	})
	if err == nil || len(join.GetStateDiskKey()) > 0 || !strings.Contains(err.Error(), "PCR 15") {
		t.Fatalf("join of a locked node: err = %v, want a refusal naming PCR 15", err)
	}
	rejoin, err := e.attested.IssueRejoinTicket(context.Background(), &joinpb.IssueRejoinTicketRequest{DiskUuid: uuid})
	if err == nil || len(rejoin.GetStateDiskKey()) > 0 || !strings.Contains(err.Error(), "PCR 15") {
		t.Fatalf("rejoin of a locked node: err = %v, want a refusal naming PCR 15", err)
	}
}
