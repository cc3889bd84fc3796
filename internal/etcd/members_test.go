package etcd

import (
	"context"
	"errors"
	"testing"

	"github.com/orrery-dev/orrery/internal/proto/etcdpb"
	"github.com/orrery-dev/orrery/internal/testkit/apiservertest"
)

// TestMembershipOfARealEtcd reads a real etcd's members and status, and
// removes a member: a learner added for the test, which never starts, as
// a control plane whose join failed would leave one.
func TestMembershipOfARealEtcd(t *testing.T) {
	e := apiservertest.StartEtcd(t)
	m := Member{Endpoint: e.Endpoint, CACert: e.CACert, ClientCert: e.ClientCert, ClientKey: e.ClientKey}
	var before []MemberInfo
	if err := retry(t, func(ctx context.Context) (err error) { before, err = m.Members(ctx); return err }); err != nil {
		t.Fatal(err)
	}
	if len(before) != 1 || before[0].Name == "" || before[0].Learner || before[0].ID == 0 {
		t.Fatalf("members %+v, want one started voting member", before)
	}
	st, err := m.Status(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if st.ID != before[0].ID || st.Leader != st.ID || st.RaftIndex == 0 || st.Learner || st.Version == "" {
		t.Errorf("status %+v, want member %x leading", st, before[0].ID)
	}

	conn, err := m.dial()
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	added, err := etcdpb.NewClusterClient(conn).MemberAdd(t.Context(), &etcdpb.MemberAddRequest{PeerUrls: []string{"http://127.0.0.1:9"}, IsLearner: true})
	if err != nil {
		t.Fatal(err)
	}
	learner := added.GetMember().GetID()
	now, err := m.Members(t.Context())
	if err != nil || len(now) != 2 {
		t.Fatalf("members after adding a learner: %+v, %v", now, err)
	}
	health := m.Health(t.Context(), now)
	if h := health[before[0].ID]; h.Err != nil || h.Status.ID != before[0].ID {
		t.Errorf("the started member's health: %+v, want its status", h)
	}
	if h := health[learner]; h.Err == nil {
		t.Errorf("the learner that never started is healthy: %+v", h)
	}
	if got := Healthy(health); len(got) != 1 || !got[before[0].ID] {
		t.Errorf("Healthy = %v, want the started member alone", got)
	}
	if err := CheckRemoval(now, Healthy(health), learner); err != nil {
		t.Errorf("CheckRemoval of the learner: %v", err)
	}
	left, err := m.Remove(t.Context(), learner)
	if err != nil || len(left) != 1 || left[0].ID != before[0].ID {
		t.Fatalf("Remove of the learner: %+v, %v; want the first member alone", left, err)
	}
	if _, err := m.Remove(t.Context(), learner); err == nil {
		t.Error("removing a member that is gone succeeded")
	}
	if err := CheckRemoval(left, map[uint64]bool{before[0].ID: true}, before[0].ID); !errors.Is(err, ErrLastMember) {
		t.Errorf("CheckRemoval of the last member: %v, want ErrLastMember", err)
	}
}

func TestCheckRemoval(t *testing.T) {
	three := []MemberInfo{{ID: 1, Name: "cp-0"}, {ID: 2, Name: "cp-1"}, {ID: 3, Name: "cp-2"}}
	all := map[uint64]bool{1: true, 2: true, 3: true}
	for _, c := range []struct {
		name    string
		members []MemberInfo
		healthy map[uint64]bool
		remove  uint64
		want    error
	}{
		{"one of three, all healthy", three, all, 3, nil},
		{"the broken one of three", three, map[uint64]bool{1: true, 2: true}, 3, nil},
		{"a healthy one while another is down", three, map[uint64]bool{1: true, 3: true}, 3, ErrQuorum},
		{"one of two", three[:2], map[uint64]bool{1: true, 2: true}, 2, nil},
		{"the healthy one of two", three[:2], map[uint64]bool{1: true}, 1, ErrQuorum},
		{"the last", three[:1], map[uint64]bool{1: true}, 1, ErrLastMember},
		{"a learner beside the last", append(three[:1:1], MemberInfo{ID: 9, Learner: true}), map[uint64]bool{1: true}, 9, nil},
		{"the last voter beside a learner", append(three[:1:1], MemberInfo{ID: 9, Learner: true}), map[uint64]bool{1: true, 9: true}, 1, ErrLastMember},
	} {
		t.Run(c.name, func(t *testing.T) {
			if err := CheckRemoval(c.members, c.healthy, c.remove); !errors.Is(err, c.want) {
				t.Errorf("CheckRemoval = %v, want %v", err, c.want)
			}
		})
	}
	if err := CheckRemoval(three, all, 7); err == nil {
		t.Error("removing no member of the cluster passed")
	}
}
