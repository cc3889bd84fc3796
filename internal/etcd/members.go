package etcd

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"sync"
	"time"

	"github.com/orrery-dev/orrery/internal/proto/etcdpb"
)

// MemberInfo is one member of the etcd cluster, as the cluster lists it.
type MemberInfo struct {
	ID uint64
	// Name is the member's name (kubeadm: the node's), empty for a member
	// added that has not started yet.
	Name     string
	PeerURLs []string
	// ClientURLs are where the member serves clients, empty for a member
	// that has not started.
	ClientURLs []string
	// Learner is a member that follows the log but does not vote: kubeadm
	// adds a joining control plane's member as one, then promotes it.
	Learner bool
}

// Status is what a member says of itself and of the cluster's raft.
type Status struct {
	// ID is the member's; Leader the leader's it knows of, zero for none.
	ID, Leader uint64
	Version    string
	// RaftIndex is the last index of the log the member has; a member
	// that catches up after a restart nears the leader's.
	RaftIndex, RaftTerm uint64
	Learner             bool
	// Alarms are the member's, such as NOSPACE.
	Alarms []string
}

// Members lists the cluster's members, as the leader knows them.
func (m Member) Members(ctx context.Context) ([]MemberInfo, error) {
	conn, err := m.dial()
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	r, err := etcdpb.NewClusterClient(conn).MemberList(ctx, &etcdpb.MemberListRequest{Linearizable: true})
	if err != nil {
		return nil, fmt.Errorf("list etcd's members through %s: %w", m.Endpoint, err)
	}
	return members(r.GetMembers()), nil
}

// Status returns the member's status.
func (m Member) Status(ctx context.Context) (Status, error) {
	conn, err := m.dial()
	if err != nil {
		return Status{}, err
	}
	defer conn.Close()
	r, err := etcdpb.NewMaintenanceClient(conn).Status(ctx, &etcdpb.StatusRequest{})
	if err != nil {
		return Status{}, fmt.Errorf("ask etcd at %s for its status: %w", m.Endpoint, err)
	}
	return Status{
		ID: r.GetHeader().GetMemberId(), Leader: r.GetLeader(), Version: r.GetVersion(),
		RaftIndex: r.GetRaftIndex(), RaftTerm: r.GetRaftTerm(), Learner: r.GetIsLearner(), Alarms: r.GetErrors(),
	}, nil
}

// Remove removes member id from the cluster, and returns the members
// left. The caller checks first that the cluster keeps its quorum
// (CheckRemoval): etcd checks it too, but only against the members it
// sees started.
func (m Member) Remove(ctx context.Context, id uint64) ([]MemberInfo, error) {
	conn, err := m.dial()
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	r, err := etcdpb.NewClusterClient(conn).MemberRemove(ctx, &etcdpb.MemberRemoveRequest{ID: id})
	if err != nil {
		return nil, fmt.Errorf("remove etcd member %x through %s: %w", id, m.Endpoint, err)
	}
	return members(r.GetMembers()), nil
}

// Health is what one member said when asked for its status.
type Health struct {
	Status Status
	// Err says why the member did not answer; nil if it did.
	Err error
}

// healthWait bounds each member's answer: a member that takes longer
// serves no one well either.
const healthWait = 5 * time.Second

// Health asks every member of members for its status at its first client
// URL, with m's credentials (every member's CA is the same), all at once.
// A member that gives no client URL has not started.
func (m Member) Health(ctx context.Context, members []MemberInfo) map[uint64]Health {
	out := make(map[uint64]Health, len(members))
	var mu sync.Mutex
	var wg sync.WaitGroup
	for _, info := range members {
		wg.Add(1)
		go func() {
			defer wg.Done()
			h := Health{Err: errors.New("it has not started")}
			if len(info.ClientURLs) > 0 {
				h = m.healthAt(ctx, info.ID, info.ClientURLs[0])
			}
			mu.Lock()
			out[info.ID] = h
			mu.Unlock()
		}()
	}
	wg.Wait()
	return out
}

func (m Member) healthAt(ctx context.Context, id uint64, clientURL string) Health {
	u, err := url.Parse(clientURL)
	if err != nil || u.Scheme != "https" || u.Host == "" {
		return Health{Err: fmt.Errorf("its client URL %q is not https://HOST:PORT", clientURL)}
	}
	ctx, cancel := context.WithTimeout(ctx, healthWait)
	defer cancel()
	other := m
	other.Endpoint = u.Host
	st, err := other.Status(ctx)
	if err == nil && st.ID != id {
		// A stale URL, or an address another member took since: its
		// answer says nothing of this member.
		err = fmt.Errorf("%s answers as member %x", clientURL, st.ID)
	}
	return Health{Status: st, Err: err}
}

// Healthy is the set of members whose Health has no error.
func Healthy(h map[uint64]Health) map[uint64]bool {
	out := map[uint64]bool{}
	for id, x := range h {
		if x.Err == nil {
			out[id] = true
		}
	}
	return out
}

func members(ms []*etcdpb.Member) []MemberInfo {
	out := make([]MemberInfo, len(ms))
	for i, m := range ms {
		out[i] = MemberInfo{ID: m.GetID(), Name: m.GetName(), PeerURLs: m.GetPeerUrls(), ClientURLs: m.GetClientUrls(), Learner: m.GetIsLearner()}
	}
	return out
}

// ErrLastMember and ErrQuorum are CheckRemoval's refusals.
var (
	ErrLastMember = errors.New("it is etcd's last voting member: the cluster's data would go with it")
	ErrQuorum     = errors.New("etcd would lose its quorum")
)

// CheckRemoval refuses to remove member id from members when the cluster
// would be left without a voting member, or with fewer healthy voting
// members than its quorum (a majority of the voting members left):
// etcd then stops serving writes, and the API server with it. healthy
// tells which members answer. A learner may always go.
func CheckRemoval(members []MemberInfo, healthy map[uint64]bool, id uint64) error {
	var found, learner bool
	voters, healthyLeft := 0, 0
	for _, m := range members {
		if m.ID == id {
			found, learner = true, m.Learner
			continue
		}
		if m.Learner {
			continue
		}
		voters++
		if healthy[m.ID] {
			healthyLeft++
		}
	}
	switch quorum := voters/2 + 1; {
	case !found:
		return fmt.Errorf("etcd has no member %x", id)
	case learner:
		return nil
	case voters == 0:
		return ErrLastMember
	case healthyLeft < quorum:
		return fmt.Errorf("%w: %d voting members would be left, %d of them healthy, and %d must be", ErrQuorum, voters, healthyLeft, quorum)
	}
	return nil
}
