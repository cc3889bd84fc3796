package upgradeserver

import (
	"context"
	"fmt"
	"net/url"
	"slices"
	"strings"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/orrery-dev/orrery/internal/clustersettings"
	"github.com/orrery-dev/orrery/internal/etcd"
	"github.com/orrery-dev/orrery/internal/nodename"
	"github.com/orrery-dev/orrery/internal/proto/kubeupgradepb"
)

// EtcdMembers implements kubeupgradepb.KubernetesUpgradeServiceServer.
func (s *Server) EtcdMembers(ctx context.Context, _ *kubeupgradepb.EtcdMembersRequest) (*kubeupgradepb.EtcdMembersResponse, error) {
	if !s.controlPlane() {
		return nil, kubeupgradepb.Refusal(codes.FailedPrecondition, kubeupgradepb.ReasonAskAnother, "this node is no control plane: it runs no etcd member")
	}
	members, err := s.c.Etcd.Members(ctx)
	if err != nil {
		return nil, status.Error(codes.Unavailable, strings.TrimSpace(err.Error()))
	}
	return s.describe(ctx, members), nil
}

// describe answers members with each one's health.
func (s *Server) describe(ctx context.Context, members []etcd.MemberInfo) *kubeupgradepb.EtcdMembersResponse {
	health := s.c.Etcd.Health(ctx, members)
	out := &kubeupgradepb.EtcdMembersResponse{}
	for _, m := range members {
		h := health[m.ID]
		pm := &kubeupgradepb.EtcdMember{Id: m.ID, Name: m.Name, Learner: m.Learner, Healthy: h.Err == nil}
		if h.Err != nil {
			pm.Error = strings.TrimSpace(h.Err.Error())
		} else {
			pm.Leader, pm.RaftIndex = h.Status.Leader == m.ID, h.Status.RaftIndex
		}
		out.Members = append(out.Members, pm)
	}
	return out
}

// RemoveEtcdMember implements kubeupgradepb.KubernetesUpgradeServiceServer.
// The owner removes a control plane's member before its node, so that
// etcd never counts a member that is gone for good in its quorum.
func (s *Server) RemoveEtcdMember(ctx context.Context, req *kubeupgradepb.RemoveEtcdMemberRequest) (*kubeupgradepb.EtcdMembersResponse, error) {
	name := req.GetName()
	if !nodename.Valid(name) {
		return nil, status.Errorf(codes.InvalidArgument, "%s is not a node name", clustersettings.Quote(name))
	}
	if !s.controlPlane() {
		return nil, kubeupgradepb.Refusal(codes.FailedPrecondition, kubeupgradepb.ReasonAskAnother, "this node is no control plane: it runs no etcd member")
	}
	// One removal at a time on this control plane: two at once could
	// each keep the quorum alone and lose it together. Two through two
	// control planes can still do so (docs/security.md).
	s.removing.Lock()
	defer s.removing.Unlock()
	members, err := s.c.Etcd.Members(ctx)
	if err != nil {
		return nil, status.Error(codes.Unavailable, strings.TrimSpace(err.Error()))
	}
	self, err := s.c.Etcd.Status(ctx)
	if err != nil {
		return nil, status.Error(codes.Unavailable, strings.TrimSpace(err.Error()))
	}
	target, err := findMember(members, name, req.GetAddress())
	if err != nil {
		return nil, err
	}
	if target.ID == self.ID {
		return nil, kubeupgradepb.Refusal(codes.FailedPrecondition, kubeupgradepb.ReasonAskAnother, "%s is this node's own etcd member: ask another control plane to remove it", name)
	}
	if err := etcd.CheckRemoval(members, etcd.Healthy(s.c.Etcd.Health(ctx, members)), target.ID); err != nil {
		if !req.GetBreakQuorum() {
			return nil, kubeupgradepb.Refusal(codes.FailedPrecondition, kubeupgradepb.ReasonQuorum, "not removing %s's etcd member: %v", name, err)
		}
		s.c.Log.Warn("removing an etcd member although etcd loses its quorum or its last member: the owner forced it", "member", name, "reason", err.Error())
	}
	left, err := s.c.Etcd.Remove(ctx, target.ID)
	if err != nil {
		return nil, removeError(name, err)
	}
	s.c.Log.Info("removed an etcd member for the owner", "member", name, "id", fmt.Sprintf("%x", target.ID), "left", len(left))
	return s.describe(ctx, left), nil
}

// findMember finds the member of the control plane called name: the one
// member of that name, or else one added that never started (so it has
// no name yet) whose peer URL is at address.
func findMember(members []etcd.MemberInfo, name, address string) (etcd.MemberInfo, error) {
	var named, unstarted []etcd.MemberInfo
	for _, m := range members {
		switch {
		case m.Name == name:
			named = append(named, m)
		case m.Name == "" && atAddress(m, address):
			unstarted = append(unstarted, m)
		}
	}
	switch {
	case len(named) > 1:
		return etcd.MemberInfo{}, status.Errorf(codes.FailedPrecondition, "etcd has %d members named %s: remove the wrong one with etcdctl", len(named), name)
	case len(named) == 1:
		return named[0], nil
	case len(unstarted) == 1:
		return unstarted[0], nil
	case len(unstarted) > 1:
		return etcd.MemberInfo{}, status.Errorf(codes.FailedPrecondition, "etcd has %d members at %s that never started: remove them with etcdctl", len(unstarted), address)
	}
	// NotFound lets the owner's removal go on as if the member were
	// gone: not while one at the node's address answers to another name.
	for _, m := range members {
		if atAddress(m, address) {
			return etcd.MemberInfo{}, status.Errorf(codes.FailedPrecondition,
				"etcd has no member named %s, but its member %s (%x) is at that node's address %s: if it is that node's, remove it with etcdctl", name, m.Name, m.ID, address)
		}
	}
	return etcd.MemberInfo{}, status.Errorf(codes.NotFound, "etcd has no member named %s (its members: %s)", name, memberNames(members))
}

// atAddress says whether member m's peers reach it at address.
func atAddress(m etcd.MemberInfo, address string) bool {
	return address != "" && slices.ContainsFunc(m.PeerURLs, func(u string) bool { return peerHost(u) == address })
}

// peerHost is the host of a member's peer URL.
func peerHost(peerURL string) string {
	u, err := url.Parse(peerURL)
	if err != nil {
		return ""
	}
	return u.Hostname()
}

// removeError tells etcd's own refusals, which say the cluster would lose
// its quorum (etcd's strict reconfiguration check counts the members it
// heard from lately), from a member that did not answer.
func removeError(name string, err error) error {
	msg := strings.TrimSpace(err.Error())
	for _, refusal := range []string{"unhealthy cluster", "not enough started members"} {
		if strings.Contains(msg, refusal) {
			return status.Errorf(codes.FailedPrecondition, "etcd itself refuses to remove %s's member: it would lose its quorum (%s); bring the other members back first", name, msg)
		}
	}
	return status.Error(codes.Unavailable, msg)
}

func memberNames(ms []etcd.MemberInfo) string {
	var names []string
	for _, m := range ms {
		n := m.Name
		if n == "" {
			n = fmt.Sprintf("%x (not started)", m.ID)
		}
		names = append(names, n)
	}
	if len(names) == 0 {
		return "none"
	}
	return strings.Join(names, ", ")
}
