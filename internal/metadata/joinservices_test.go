package metadata

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"testing"

	"github.com/orrery-dev/orrery/internal/role"
)

type fakeSource struct {
	self     Instance
	peers    []Instance
	endpoint string // empty: the cloud names none
}

func (f fakeSource) Self(context.Context) (Instance, error)    { return f.self, nil }
func (f fakeSource) Peers(context.Context) ([]Instance, error) { return f.peers, nil }
func (f fakeSource) Endpoint(context.Context) (netip.AddrPort, error) {
	if f.endpoint == "" {
		return netip.AddrPort{}, errors.New("404")
	}
	return netip.ParseAddrPort(f.endpoint)
}

func TestJoinServices(t *testing.T) {
	inst := func(name string, r role.Role, ip string) Instance {
		return Instance{Name: name, Role: r, IP: netip.MustParseAddr(ip)}
	}
	cp0, cp1 := inst("cp-0", role.ControlPlane, "10.42.1.100"), inst("cp-1", role.ControlPlane, "10.42.1.101")
	w0 := inst("worker-0", role.Worker, "10.42.2.100")
	all := []Instance{cp0, cp1, w0}
	for name, tc := range map[string]struct {
		src  fakeSource
		want string
	}{
		"worker, load balancer first":    {fakeSource{w0, all, "10.42.0.2:6443"}, "[{the control-plane endpoint 10.42.0.2:30090} {cp-0 10.42.1.100:30090} {cp-1 10.42.1.101:30090}]"},
		"worker, no endpoint":            {fakeSource{w0, all, ""}, "[{cp-0 10.42.1.100:30090} {cp-1 10.42.1.101:30090}]"},
		"endpoint is the first CP":       {fakeSource{w0, all, "10.42.1.100:6443"}, "[{cp-0 10.42.1.100:30090} {cp-1 10.42.1.101:30090}]"},
		"control plane, never itself":    {fakeSource{cp1, all, "10.42.0.2:6443"}, "[{the control-plane endpoint 10.42.0.2:30090} {cp-0 10.42.1.100:30090}]"},
		"the only control plane":         {fakeSource{cp0, []Instance{cp0, w0}, "10.42.0.2:6443"}, "[]"},
		"no control plane at all":        {fakeSource{w0, []Instance{w0}, "10.42.0.2:6443"}, "[]"},
		"endpoint is this control plane": {fakeSource{cp0, all, "10.42.1.100:6443"}, "[{cp-1 10.42.1.101:30090}]"},
	} {
		t.Run(name, func(t *testing.T) {
			self, got, err := JoinServices(context.Background(), tc.src, 30090)
			if err != nil || self != tc.src.self || fmt.Sprint(got) != tc.want {
				t.Fatalf("JoinServices = %v, %v, %v; want %v", self, got, err, tc.want)
			}
		})
	}
}
