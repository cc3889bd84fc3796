package upgradeserver

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/orrery-dev/orrery/bootstrapperd/internal/kubeadm/kubeadmtest"
	"github.com/orrery-dev/orrery/internal/etcd"
	"github.com/orrery-dev/orrery/internal/proto/kubeupgradepb"
	"github.com/orrery-dev/orrery/internal/testkit/apiservertest"
)

// membership is the part of Etcd beyond the snapshot.
type membership interface {
	Members(ctx context.Context) ([]etcd.MemberInfo, error)
	Health(ctx context.Context, members []etcd.MemberInfo) map[uint64]etcd.Health
	Status(ctx context.Context) (etcd.Status, error)
	Remove(ctx context.Context, id uint64) ([]etcd.MemberInfo, error)
}

// fakeMembers is three control planes' etcd, seen from cp-0 (member 1);
// the members in sick do not answer.
type fakeMembers struct {
	mu      sync.Mutex
	members []etcd.MemberInfo
	sick    map[uint64]bool
	removed []uint64
	// refuse is etcd's own refusal of every removal, if set.
	refuse error
}

func threeMembers(sick ...uint64) *fakeMembers {
	f := &fakeMembers{sick: map[uint64]bool{}}
	for i, name := range []string{"cp-0", "cp-1", "cp-2"} {
		f.members = append(f.members, etcd.MemberInfo{ID: uint64(i + 1), Name: name})
	}
	for _, id := range sick {
		f.sick[id] = true
	}
	return f
}

func (f *fakeMembers) Members(context.Context) ([]etcd.MemberInfo, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]etcd.MemberInfo(nil), f.members...), nil
}

func (f *fakeMembers) Health(_ context.Context, ms []etcd.MemberInfo) map[uint64]etcd.Health {
	out := map[uint64]etcd.Health{}
	for _, m := range ms {
		if f.sick[m.ID] {
			out[m.ID] = etcd.Health{Err: errors.New("context deadline exceeded")}
		} else {
			out[m.ID] = etcd.Health{Status: etcd.Status{ID: m.ID, Leader: 1, RaftIndex: 42}}
		}
	}
	return out
}

func (f *fakeMembers) Status(context.Context) (etcd.Status, error) {
	return etcd.Status{ID: 1, Leader: 1}, nil
}

func (f *fakeMembers) Remove(_ context.Context, id uint64) ([]etcd.MemberInfo, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.refuse != nil {
		return nil, f.refuse
	}
	f.removed = append(f.removed, id)
	var left []etcd.MemberInfo
	for _, m := range f.members {
		if m.ID != id {
			left = append(left, m)
		}
	}
	f.members = left
	return left, nil
}

// refusing makes etcd refuse every removal, as its strict
// reconfiguration check does one that would cost its quorum.
func refusing(f *fakeMembers) *fakeMembers {
	f.refuse = status.Error(codes.Unavailable, "etcdserver: unhealthy cluster")
	return f
}

// withUnstarted adds a learner that kubeadm added for cp-3 and that never
// started: it has no name yet.
func withUnstarted(f *fakeMembers) *fakeMembers {
	f.members = append(f.members, etcd.MemberInfo{ID: 4, PeerURLs: []string{"https://10.42.1.103:2380"}, Learner: true})
	return f
}

// withRenamed adds member cp-9 at cp-3's address: cp-3's member, renamed
// by root on cp-3.
func withRenamed(f *fakeMembers) *fakeMembers {
	f.members = append(f.members, etcd.MemberInfo{ID: 4, Name: "cp-9", PeerURLs: []string{"https://10.42.1.103:2380"}})
	return f
}

// controlPlaneWith serves a control plane whose etcd is m.
func controlPlaneWith(t *testing.T, m membership) kubeupgradepb.KubernetesUpgradeServiceClient {
	t.Helper()
	oldest, _ := releases(t)
	f := newFixture(t, oldest, kubeadmtest.KeptPods(t, oldest))
	f.cfg.Etcd = fakeEtcd{membership: m}
	return serve(t, New(f.cfg))
}

func names(r *kubeupgradepb.EtcdMembersResponse) string {
	var out []string
	for _, m := range r.GetMembers() {
		out = append(out, fmt.Sprintf("%s:healthy=%v,leader=%v", m.GetName(), m.GetHealthy(), m.GetLeader()))
	}
	return strings.Join(out, " ")
}

func TestEtcdMembers(t *testing.T) {
	oldest, _ := releases(t)
	worker := newFixture(t, oldest, "")
	if _, err := worker.client.EtcdMembers(t.Context(), &kubeupgradepb.EtcdMembersRequest{}); status.Code(err) != codes.FailedPrecondition {
		t.Errorf("a worker's etcd members: %v, want FailedPrecondition", err)
	}
	c := controlPlaneWith(t, threeMembers(3))
	r, err := c.EtcdMembers(t.Context(), &kubeupgradepb.EtcdMembersRequest{})
	if want := "cp-0:healthy=true,leader=true cp-1:healthy=true,leader=false cp-2:healthy=false,leader=false"; err != nil || names(r) != want {
		t.Fatalf("EtcdMembers = %s, %v; want %s", names(r), err, want)
	}
	if e := r.GetMembers()[2].GetError(); !strings.Contains(e, "deadline") {
		t.Errorf("the sick member's error %q does not say why", e)
	}
}

// The refusals of a control plane's removal: the node's own member, a
// member that is not there, and any removal that would leave etcd
// without its quorum, which only break_quorum gets past.
func TestRemoveEtcdMember(t *testing.T) {
	for _, tc := range []struct {
		name        string
		members     *fakeMembers
		remove      string
		breakQuorum bool
		want        codes.Code
		wantMsg     string
		wantReason  string
		wantLeft    string
	}{
		{"one of three", threeMembers(), "cp-2", false, codes.OK, "", "", "cp-0:healthy=true,leader=true cp-1:healthy=true,leader=false"},
		{"the broken one", threeMembers(3), "cp-2", false, codes.OK, "", "", "cp-0:healthy=true,leader=true cp-1:healthy=true,leader=false"},
		{"a healthy one while another is broken", threeMembers(3), "cp-1", false, codes.FailedPrecondition, "etcd would lose its quorum", kubeupgradepb.ReasonQuorum, ""},
		{"the same, forced", threeMembers(3), "cp-1", true, codes.OK, "", "", "cp-0:healthy=true,leader=true cp-2:healthy=false,leader=false"},
		{"this node's own", threeMembers(), "cp-0", false, codes.FailedPrecondition, "ask another control plane", kubeupgradepb.ReasonAskAnother, ""},
		{"one not there", threeMembers(), "cp-7", false, codes.NotFound, "its members: cp-0, cp-1, cp-2", "", ""},
		{"no node name", threeMembers(), "CP_1; rm -rf", false, codes.InvalidArgument, "is not a node name", "", ""},
		// Forcing gets past the node's count, never past etcd's own.
		{"one etcd refuses", refusing(threeMembers(3)), "cp-1", true, codes.FailedPrecondition, "etcd itself refuses to remove cp-1's member", "", ""},
		{"one that never started", withUnstarted(threeMembers()), "cp-3", false, codes.OK, "", "", "cp-0:healthy=true,leader=true cp-1:healthy=true,leader=false cp-2:healthy=true,leader=false"},
		{"one renamed at the node's address", withRenamed(threeMembers()), "cp-3", true, codes.FailedPrecondition, "its member cp-9 (4) is at that node's address", "", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := controlPlaneWith(t, tc.members)
			r, err := c.RemoveEtcdMember(t.Context(), &kubeupgradepb.RemoveEtcdMemberRequest{Name: tc.remove, BreakQuorum: tc.breakQuorum, Address: "10.42.1.103"})
			if status.Code(err) != tc.want || !strings.Contains(status.Convert(err).Message(), tc.wantMsg) {
				t.Fatalf("RemoveEtcdMember: %v; want %v saying %q", err, tc.want, tc.wantMsg)
			}
			if got := kubeupgradepb.Reason(err); got != tc.wantReason {
				t.Errorf("the refusal's reason is %q, want %q: the owner's CLI suggests what to do from it", got, tc.wantReason)
			}
			if tc.want != codes.OK {
				if len(tc.members.removed) > 0 {
					t.Errorf("refused, but removed %v", tc.members.removed)
				}
				return
			}
			if names(r) != tc.wantLeft {
				t.Errorf("left %s, want %s", names(r), tc.wantLeft)
			}
		})
	}
}

// Against a real etcd: the member answers for itself, and the node does
// not remove its own.
func TestEtcdMembersOfARealEtcd(t *testing.T) {
	e := apiservertest.StartEtcd(t)
	m := etcd.Member{Endpoint: e.Endpoint, CACert: e.CACert, ClientCert: e.ClientCert, ClientKey: e.ClientKey}
	c := controlPlaneWith(t, m)
	var r *kubeupgradepb.EtcdMembersResponse
	var err error
	// A new etcd elects itself leader a moment after it answers.
	for range 50 {
		if r, err = c.EtcdMembers(t.Context(), &kubeupgradepb.EtcdMembersRequest{}); err == nil && len(r.GetMembers()) == 1 && r.GetMembers()[0].GetLeader() {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if err != nil || len(r.GetMembers()) != 1 || !r.GetMembers()[0].GetHealthy() || !r.GetMembers()[0].GetLeader() || r.GetMembers()[0].GetRaftIndex() == 0 {
		t.Fatalf("EtcdMembers = %v, %v; want one healthy leader", r, err)
	}
	name := r.GetMembers()[0].GetName()
	if _, err := c.RemoveEtcdMember(t.Context(), &kubeupgradepb.RemoveEtcdMemberRequest{Name: name, BreakQuorum: true}); status.Code(err) != codes.FailedPrecondition {
		t.Errorf("removing its own member: %v, want FailedPrecondition", err)
	}
}
