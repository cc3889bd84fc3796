// Package role names what a node is in a cluster. The cloud's metadata
// says it, the local cloud assigns it, and a node acts on it; the join
// service never trusts it for anything that matters (control-plane keys go
// only to VMs the owner approved).
package role

import "fmt"

// Role is a node's role.
type Role string

// The roles.
const (
	ControlPlane Role = "control-plane"
	Worker       Role = "worker"
)

// Validate fails for a role that is neither of the two, spelled exactly.
func (r Role) Validate() error {
	switch r {
	case ControlPlane, Worker:
		return nil
	}
	return fmt.Errorf("invalid role %q: want %q or %q", string(r), ControlPlane, Worker)
}
