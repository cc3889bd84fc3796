// Command flannel is a CNI plugin that connects a pod to the network flanneld
// manages on this node. The module proxy does not carry flannel's own CNI
// plugin (github.com/flannel-io/cni-plugin), so Orrery ships this one, which
// reads the same configuration.
//
// flanneld writes the node's pod subnet to a subnet file
// (/run/flannel/subnet.env). On ADD the plugin turns that into the
// configuration of a delegate plugin (bridge with host-local IPAM unless the
// network configuration says otherwise), saves it under dataDir keyed by the
// container ID, and runs the delegate. DEL and CHECK run the delegate with the
// saved configuration, so they work even after the subnet file has changed.
package main

import (
	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/version"
)

// pluginVersion is set by build.sh.
var pluginVersion = "dev"

func main() {
	skel.PluginMainFuncs(skel.CNIFuncs{Add: cmdAdd, Del: cmdDel, Check: cmdCheck},
		version.All, "Orrery flannel CNI plugin "+pluginVersion)
}
