// Package noderemove takes a node out of the cluster for good ('orrery
// node remove'). A removed node may be compromised and still holds its
// kubelet's certificate and its state disk; removing it must leave it no
// way back in (a control plane also keeps the cluster's CA keys and
// etcd's, which no removal takes back):
//
//  0. a control plane's etcd member is removed, through another control
//     plane, and its instance is no longer approved as a control plane;
//     the last control plane, the one whose address is the cluster's
//     endpoint, and one without which etcd would lose its quorum are
//     refused (the last unless the owner forces it, as far as etcd lets
//     him);
//  1. its admission records are marked removed (internal/records/admitted), so the
//     join service never again hands out its disk key, whatever Node
//     object it re-creates; the records' schema keeps the mark for good;
//  2. it is drained: cordoned, and its pods evicted (those of DaemonSets
//     and static pods excepted, which go with the node);
//  3. its name and instance go on the removed list (internal/records/removednodes),
//     through which the API server refuses every write of its kubelet's
//     credentials and the join service every ticket, also for a new disk;
//  4. its Node is deleted.
//
// The list comes after the drain: a kubelet that may not write cannot
// confirm that its pods stopped, and a drain would wait for nothing. The
// records come first, so the node cannot rejoin meanwhile.
package noderemove

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"slices"
	"strings"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/util/retry"

	"github.com/orrery-dev/orrery/internal/owner/drain"
	"github.com/orrery-dev/orrery/internal/owner/kubeupgrade"
	"github.com/orrery-dev/orrery/internal/owner/nodeaddr"
	"github.com/orrery-dev/orrery/internal/proto/kubeupgradepb"
	"github.com/orrery-dev/orrery/internal/records/controlplanes"
	"github.com/orrery-dev/orrery/internal/records/kubeadmconfig"
	"github.com/orrery-dev/orrery/internal/records/orreryapi"
	"github.com/orrery-dev/orrery/internal/records/removednodes"
)

// controlPlaneLabel marks the control planes.
const controlPlaneLabel = "node-role.kubernetes.io/control-plane"

var admittedNodes = schema.GroupVersionResource{Group: orreryapi.Group, Version: orreryapi.Version, Resource: orreryapi.AdmittedNodes}

// ControlPlane is another control plane's upgrade service
// (kubeupgrade.Remote), through which a control plane's etcd member goes.
type ControlPlane interface {
	RemoveEtcdMember(ctx context.Context, name, address string, breakQuorum bool) ([]kubeupgrade.EtcdMember, error)
	Close() error
}

// Config is what a removal needs.
type Config struct {
	Client  kubernetes.Interface
	Dynamic dynamic.Interface
	// DialControlPlane reaches the upgrade service of the control plane
	// called name at addr, which must prove it is that node; nil refuses
	// to remove control planes.
	DialControlPlane func(ctx context.Context, name, addr string) (ControlPlane, error)
	// BreakQuorum removes a control plane whose etcd member the cluster
	// cannot lose without losing etcd's quorum.
	BreakQuorum bool
	// Removed, if set, hears once the cluster's records mark node name
	// removed, with the instance IDs its disks were admitted for: the
	// owner's records follow.
	Removed func(name string, instanceIDs []string)
	// Direct, if set, gives clients of the API server of the control
	// plane at addr itself, not through the cluster's endpoint. Once a
	// control plane's etcd member is removed, the rest of its removal
	// goes to the control plane that removed it: until the endpoint's
	// health check takes the removed node out, it may still send
	// connections to its API server, which has no etcd left to answer
	// from.
	Direct func(addr string) (kubernetes.Interface, dynamic.Interface, error)
	// Out gets a line per step.
	Out io.Writer
	// DrainTimeout bounds the wait for evicted pods to go; zero means 2
	// minutes. Pods still there then go with the Node.
	DrainTimeout time.Duration
	// Now is the clock; nil means time.Now.
	Now func() time.Time
}

// Remove removes node name from the cluster for good.
func Remove(ctx context.Context, cfg Config, name string) error {
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.DrainTimeout == 0 {
		cfg.DrainTimeout = 2 * time.Minute
	}
	now := cfg.Now().UTC().Truncate(time.Second)
	node, err := cfg.Client.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		node = nil
	case err != nil:
		return fmt.Errorf("read node %s: %w", name, err)
	}
	// A control plane is known by the cluster's records too: its Node,
	// and so its label, may be gone.
	approved, err := approvedControlPlane(ctx, cfg, name)
	if err != nil {
		return err
	}
	isCP := len(approved) > 0
	if node != nil {
		_, labelled := node.Labels[controlPlaneLabel]
		isCP = isCP || labelled
	}
	if isCP {
		address := ""
		if node != nil {
			address = nodeaddr.InternalIP(*node)
		}
		if cfg, err = leaveControlPlanes(ctx, cfg, name, address, approved); err != nil {
			return err
		}
	}
	records, err := markRecordsRemoved(ctx, cfg, name, now)
	if err != nil {
		return err
	}
	if cfg.Removed != nil {
		// The approved instances are among the records' (both are read
		// from name's admission records).
		cfg.Removed(name, records)
	}
	if node == nil && len(records) == 0 {
		return fmt.Errorf("the cluster has no node %s and no record of a disk admitted for it: check the name ('kubectl get nodes', 'kubectl get admittednodes')", name)
	}
	if node != nil {
		if err := drainNode(ctx, cfg, name); err != nil {
			return err
		}
	}
	entry := removednodes.Entry{RemovedAt: now}
	if len(records) > 0 {
		entry.InstanceID = records[0]
	}
	if err := list(ctx, cfg, name, entry); err != nil {
		return err
	}
	fmt.Fprintf(cfg.Out, "node %s: its kubelet's credentials may no longer write (%s/%s)\n", name, removednodes.Namespace, removednodes.ConfigMapName)
	if node != nil {
		err := cfg.Client.CoreV1().Nodes().Delete(ctx, name, metav1.DeleteOptions{})
		if err != nil && !apierrors.IsNotFound(err) {
			return fmt.Errorf("delete node %s: %w", name, err)
		}
		fmt.Fprintf(cfg.Out, "node %s: deleted\n", name)
	}
	fmt.Fprintf(cfg.Out, "node %s removed: it gets no join or rejoin ticket again\n", name)
	return nil
}

// leaveControlPlanes removes control plane name's etcd member and revokes
// its approved instances; the cfg it returns reaches the API server of
// the control plane that removed the member.
func leaveControlPlanes(ctx context.Context, cfg Config, name, address string, approved []string) (Config, error) {
	via, err := leaveEtcd(ctx, cfg, name, address)
	if err != nil {
		return cfg, err
	}
	if cfg.Direct != nil && via != "" {
		if cfg.Client, cfg.Dynamic, err = cfg.Direct(via); err != nil {
			return cfg, fmt.Errorf("node %s: its etcd member is removed; reach the API server at %s for the rest: %w\nrun the same removal again", name, via, err)
		}
	}
	for _, id := range approved {
		if err := revoke(ctx, cfg, id); err != nil {
			return cfg, err
		}
		fmt.Fprintf(cfg.Out, "node %s: instance %s is no longer an approved control plane: the join service hands it no more CA keys\n", name, id)
	}
	return cfg, nil
}

// approvedControlPlane returns the instance IDs of name's admission
// records that the owner approved as control planes.
func approvedControlPlane(ctx context.Context, cfg Config, name string) ([]string, error) {
	cm, err := cfg.Client.CoreV1().ConfigMaps(controlplanes.Namespace).Get(ctx, controlplanes.ConfigMapName, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read the approved control planes (%s/%s): %w", controlplanes.Namespace, controlplanes.ConfigMapName, err)
	}
	approved, err := controlplanes.Parse(cm.Data[controlplanes.Key])
	if err != nil {
		return nil, fmt.Errorf("the approved control planes (%s/%s): %w", controlplanes.Namespace, controlplanes.ConfigMapName, err)
	}
	recs, err := cfg.Dynamic.Resource(admittedNodes).List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("list the admitted nodes (is this the kubeconfig of a cluster 'orrery init' set up?): %w", err)
	}
	var ids []string
	for _, r := range recs.Items {
		n, _, _ := unstructured.NestedString(r.Object, "spec", "instance", "name")
		id, _, _ := unstructured.NestedString(r.Object, "spec", "instance", "id")
		if n == name && slices.Contains(approved, id) && !slices.Contains(ids, id) {
			ids = append(ids, id)
		}
	}
	return ids, nil
}

// ErrLastControlPlane refuses to remove the cluster's only control plane.
var ErrLastControlPlane = errors.New("it is the cluster's last control plane: etcd, and every object of the cluster, would go with it; a cluster is deleted with its VMs ('orrery mini down' for the local cloud), not by removing its nodes")

// leaveEtcd removes control plane name's etcd member through another
// control plane, which refuses a removal that costs etcd its quorum
// unless the owner forces it, and returns that control plane's address.
// A member that is gone already (a removal run again) is fine.
func leaveEtcd(ctx context.Context, cfg Config, name, address string) (string, error) {
	if cfg.DialControlPlane == nil {
		return "", fmt.Errorf("node %s is a control plane, and this removal cannot reach the others to remove its etcd member", name)
	}
	nodes, err := cfg.Client.CoreV1().Nodes().List(ctx, metav1.ListOptions{LabelSelector: controlPlaneLabel})
	if err != nil {
		return "", fmt.Errorf("list the control planes: %w", err)
	}
	var others []corev1.Node
	for _, n := range nodes.Items {
		if n.Name != name {
			others = append(others, n)
		}
	}
	if len(others) == 0 {
		return "", fmt.Errorf("not removing node %s: %w", name, ErrLastControlPlane)
	}
	if err := refuseEndpoint(ctx, cfg, name, address); err != nil {
		return "", err
	}
	var errs []error
	for _, n := range others {
		addr := nodeaddr.InternalIP(n)
		if addr == "" {
			errs = append(errs, fmt.Errorf("%s: its Node lists no internal IP", n.Name))
			continue
		}
		cp, err := cfg.DialControlPlane(ctx, n.Name, addr)
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", n.Name, err))
			continue
		}
		// A control plane that takes the call and then hangs (a frozen
		// VM) must not hold the removal: another may answer.
		callCtx, cancel := context.WithTimeout(ctx, memberRemovalTimeout)
		left, err := cp.RemoveEtcdMember(callCtx, name, address, cfg.BreakQuorum)
		cancel()
		cp.Close()
		switch code, reason := status.Code(err), kubeupgradepb.Reason(err); {
		case code == codes.OK:
			fmt.Fprintf(cfg.Out, "node %s: its etcd member is removed (through %s); etcd's members: %s\n", name, n.Name, memberList(left))
			return addr, nil
		case code == codes.NotFound:
			fmt.Fprintf(cfg.Out, "node %s: it is no etcd member (%s says: %v)\n", name, n.Name, err)
			return addr, nil
		case reason == kubeupgradepb.ReasonQuorum && !cfg.BreakQuorum:
			return "", fmt.Errorf("not removing node %s: %w\nif the cluster is to go on without it anyway, and etcd stops serving writes (and the API server with it) until enough members are back, run this again with --break-etcd-quorum", name, err)
		case reason == kubeupgradepb.ReasonAskAnother:
		case code == codes.FailedPrecondition || code == codes.InvalidArgument:
			return "", fmt.Errorf("not removing node %s: %s refuses: %w", name, n.Name, err)
		}
		errs = append(errs, fmt.Errorf("%s: %w", n.Name, err))
		if ctx.Err() != nil {
			break
		}
	}
	return "", fmt.Errorf("not removing node %s: no other control plane removed its etcd member:\n%w", name, errors.Join(errs...))
}

// memberRemovalTimeout bounds one control plane's removal of a member: it
// checks every member's health first, each within seconds when it
// answers.
const memberRemovalTimeout = 2 * time.Minute

// refuseEndpoint refuses control plane name, at address, if its address
// is the cluster's endpoint (a cluster set up without a load balancer):
// every kubeconfig and join ticket names it, and the cluster would stop
// with it.
func refuseEndpoint(ctx context.Context, cfg Config, name, address string) error {
	cm, err := cfg.Client.CoreV1().ConfigMaps(kubeadmconfig.Namespace).Get(ctx, kubeadmconfig.ConfigMapName, metav1.GetOptions{})
	if err != nil {
		return fmt.Errorf("read the cluster's endpoint (%s/%s): %w", kubeadmconfig.Namespace, kubeadmconfig.ConfigMapName, err)
	}
	endpoint, err := kubeadmconfig.ControlPlaneEndpoint(cm.Data)
	if err != nil {
		return err
	}
	if host, _, err := net.SplitHostPort(endpoint); err == nil && address != "" && host == address {
		return fmt.Errorf("not removing node %s: its address is the cluster's control-plane endpoint %s, which every kubeconfig and join ticket names: the cluster would stop with it (a cluster that is to lose control planes needs 'orrery init --endpoint' with a load balancer)", name, endpoint)
	}
	return nil
}

func memberList(ms []kubeupgrade.EtcdMember) string {
	var parts []string
	for _, m := range ms {
		s := m.Name
		if !m.Healthy {
			s += " (not answering)"
		}
		parts = append(parts, s)
	}
	return strings.Join(parts, ", ")
}

// revoke takes instance id off the approved control planes.
func revoke(ctx context.Context, cfg Config, id string) error {
	cms := cfg.Client.CoreV1().ConfigMaps(controlplanes.Namespace)
	return retry.RetryOnConflict(retry.DefaultRetry, func() error {
		cm, err := cms.Get(ctx, controlplanes.ConfigMapName, metav1.GetOptions{})
		if err != nil {
			return fmt.Errorf("read the approved control planes: %w", err)
		}
		text, removed, err := controlplanes.Revoke(cm.Data[controlplanes.Key], id)
		if err != nil || !removed {
			return err
		}
		cm.Data[controlplanes.Key] = text
		_, err = cms.Update(ctx, cm, metav1.UpdateOptions{})
		return err
	})
}

// markRecordsRemoved marks every admission record of node name removed at
// now and returns the instance IDs they name.
func markRecordsRemoved(ctx context.Context, cfg Config, name string, now time.Time) ([]string, error) {
	recs, err := cfg.Dynamic.Resource(admittedNodes).List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("list the admitted nodes (is this the kubeconfig of a cluster 'orrery init' set up?): %w", err)
	}
	var ids []string
	for _, r := range recs.Items {
		if n, _, _ := unstructured.NestedString(r.Object, "spec", "instance", "name"); n != name {
			continue
		}
		id, _, _ := unstructured.NestedString(r.Object, "spec", "instance", "id")
		ids = append(ids, id)
		if at, _, _ := unstructured.NestedString(r.Object, "spec", "removedAt"); at != "" {
			fmt.Fprintf(cfg.Out, "node %s: disk record %s was already marked removed at %s\n", name, r.GetName(), at)
			continue
		}
		patch := fmt.Appendf(nil, `{"spec":{"removedAt":%q}}`, now.Format(time.RFC3339))
		if _, err := cfg.Dynamic.Resource(admittedNodes).Patch(ctx, r.GetName(), types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
			return nil, fmt.Errorf("mark disk record %s removed: %w", r.GetName(), err)
		}
		fmt.Fprintf(cfg.Out, "node %s: disk record %s marked removed\n", name, r.GetName())
	}
	return ids, nil
}

// drainNode cordons node name and evicts its pods, waiting up to the
// drain timeout for them to go; those left then go with the node: the
// owner asked for the node to go.
func drainNode(ctx context.Context, cfg Config, name string) error {
	cordon := []byte(`{"spec":{"unschedulable":true}}`)
	if _, err := cfg.Client.CoreV1().Nodes().Patch(ctx, name, types.MergePatchType, cordon, metav1.PatchOptions{}); err != nil {
		return fmt.Errorf("cordon node %s: %w", name, err)
	}
	fmt.Fprintf(cfg.Out, "node %s: cordoned\n", name)
	left, err := drain.Drain(ctx, cfg.Client, name, cfg.DrainTimeout, func(format string, args ...any) {
		fmt.Fprintf(cfg.Out, "node %s: "+format+"\n", append([]any{name}, args...)...)
	})
	if err != nil {
		return err
	}
	if len(left) > 0 {
		fmt.Fprintf(cfg.Out, "node %s: %d pods still there after %s (%s); they go with the node\n", name, len(left), cfg.DrainTimeout, drain.Names(left))
		return nil
	}
	fmt.Fprintf(cfg.Out, "node %s: drained\n", name)
	return nil
}

// list puts node name on the removed list.
func list(ctx context.Context, cfg Config, name string, e removednodes.Entry) error {
	cms := cfg.Client.CoreV1().ConfigMaps(removednodes.Namespace)
	return retry.RetryOnConflict(retry.DefaultRetry, func() error {
		cm, err := cms.Get(ctx, removednodes.ConfigMapName, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			_, err = cms.Create(ctx, removednodes.ConfigMap(removednodes.List{name: e}), metav1.CreateOptions{})
			if apierrors.IsAlreadyExists(err) {
				return apierrors.NewConflict(corev1.Resource("configmaps"), removednodes.ConfigMapName, err)
			}
			return err
		}
		if err != nil {
			return fmt.Errorf("read %s/%s: %w", removednodes.Namespace, removednodes.ConfigMapName, err)
		}
		if _, err := removednodes.Parse(cm.Data); err != nil {
			return fmt.Errorf("the removed-node list cannot be read, and is not changed: %w", err)
		}
		if cm.Data == nil {
			cm.Data = map[string]string{}
		}
		cm.Data[name] = e.Value()
		_, err = cms.Update(ctx, cm, metav1.UpdateOptions{})
		return err
	})
}
