package charts

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	certificatesv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/yaml"

	"github.com/orrery-dev/orrery/internal/owner/kubeupgrade"
	"github.com/orrery-dev/orrery/internal/owner/noderemove"
	"github.com/orrery-dev/orrery/internal/proto/kubeupgradepb"
	"github.com/orrery-dev/orrery/internal/records/controlplanes"
	"github.com/orrery-dev/orrery/internal/records/kubeadmconfig"
	"github.com/orrery-dev/orrery/internal/records/orreryapi"
	"github.com/orrery-dev/orrery/internal/records/removednodes"
	"github.com/orrery-dev/orrery/internal/testkit/apiservertest"
)

const controlPlaneLabel = "node-role.kubernetes.io/control-plane"

// installCharts renders every embedded chart as 'orrery init' installs it
// (release namespace kube-system) and applies it to srv, CRDs first.
func installCharts(t *testing.T, srv *apiservertest.Server) {
	t.Helper()
	manifest, err := CRDManifest()
	if err != nil {
		t.Fatal(err)
	}
	srv.InstallCRDs(t, manifest)
	for _, name := range []string{Flannel, OrreryServices} {
		values := servicesValues()
		if name == Flannel {
			values = flannelValues()
		}
		out := render(t, name, values)
		files := make([]string, 0, len(out))
		for f := range out {
			files = append(files, f)
		}
		sort.Strings(files)
		for _, f := range files {
			srv.Apply(t, []byte(strings.ReplaceAll(out[f], "\n---", "\n---\n")))
		}
	}
}

func flannelValues() map[string]any {
	return map[string]any{"podCIDR": "10.244.0.0/16", "apiServer": map[string]any{"host": "10.42.1.100", "port": "6443"}}
}

func clientFor(t *testing.T, cfg *rest.Config) kubernetes.Interface {
	t.Helper()
	c, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// mergePatch is a JSON merge patch of obj.
func mergePatch(t *testing.T, obj map[string]any) []byte {
	t.Helper()
	b, err := json.Marshal(obj)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// nodePolicyEnv is an API server with the charts installed and the
// clients of TestWorkerCannotPlaceSecretHoldingPods: kubeadm's admin, a
// worker's kubelet and the flannel pod's token on that worker.
type nodePolicyEnv struct {
	ctx     context.Context
	admin   kubernetes.Interface
	worker  kubernetes.Interface
	flannel kubernetes.Interface
}

// newNodePolicyEnv starts the API server and sets up the cluster as
// kubeadm, the kubelets and flannel's DaemonSet do: a worker-0 and a
// control plane cp-0, and the master secret.
func newNodePolicyEnv(t *testing.T) *nodePolicyEnv {
	t.Helper()
	srv := apiservertest.Start(t)
	installCharts(t, srv)
	ctx := context.Background()
	admin := clientFor(t, srv.Config)
	if _, err := admin.CoreV1().Secrets("kube-system").Create(ctx, &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: "orrery-master-secret"}, Data: map[string][]byte{"master-secret.json": []byte("{}")},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	// The nodes register themselves, as kubelets do: a control plane
	// with the taint kubeadm gives it, which kubeadm then labels with
	// its admin credentials.
	worker := clientFor(t, srv.ConfigAs(t, "system:node:worker-0", "system:nodes"))
	cp := clientFor(t, srv.ConfigAs(t, "system:node:cp-0", "system:nodes"))
	if _, err := worker.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "worker-0"}}, metav1.CreateOptions{}); err != nil {
		t.Fatalf("a worker's kubelet registering its node: %v", err)
	}
	if _, err := cp.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "cp-0"},
		Spec: corev1.NodeSpec{Taints: []corev1.Taint{{Key: controlPlaneLabel, Effect: corev1.TaintEffectNoSchedule}}}}, metav1.CreateOptions{}); err != nil {
		t.Fatalf("a control plane's kubelet registering its node with kubeadm's taint: %v", err)
	}
	// kubeadm's admin.conf: a group bound to cluster-admin.
	if _, err := admin.RbacV1().ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "kubeadm:cluster-admins"},
		RoleRef:    rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: "cluster-admin"},
		Subjects:   []rbacv1.Subject{{Kind: "Group", Name: "kubeadm:cluster-admins", APIGroup: "rbac.authorization.k8s.io"}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	kubeadmAdmin := clientFor(t, srv.ConfigAs(t, "kubernetes-admin", "kubeadm:cluster-admins"))
	if _, err := kubeadmAdmin.CoreV1().Nodes().Patch(ctx, "cp-0", types.MergePatchType,
		mergePatch(t, map[string]any{"metadata": map[string]any{"labels": map[string]any{controlPlaneLabel: ""}}}), metav1.PatchOptions{}); err != nil {
		t.Fatalf("kubeadm marking the control plane: %v", err)
	}
	// flannel's pod on the worker, as its DaemonSet makes it, and the
	// token kubelet mounts into it.
	if _, err := admin.CoreV1().Pods("kube-system").Create(ctx, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "kube-flannel-ds-worker-0"},
		Spec:       corev1.PodSpec{NodeName: "worker-0", ServiceAccountName: "flannel", Containers: []corev1.Container{{Name: "kube-flannel", Image: "x"}}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	flannel := clientFor(t, srv.TokenFor(t, "kube-system", "kube-flannel-ds-worker-0"))
	return &nodePolicyEnv{ctx: ctx, admin: admin, worker: worker, flannel: flannel}
}

func (e *nodePolicyEnv) patchStatus(c kubernetes.Interface, node string, patch []byte) error {
	_, err := c.CoreV1().Nodes().Patch(e.ctx, node, types.MergePatchType, patch, metav1.PatchOptions{}, "status")
	return err
}

func (e *nodePolicyEnv) patchNode(c kubernetes.Interface, node string, patch []byte) error {
	_, err := c.CoreV1().Nodes().Patch(e.ctx, node, types.MergePatchType, patch, metav1.PatchOptions{})
	return err
}

func labelPatch(t *testing.T, key string) []byte {
	return mergePatch(t, map[string]any{"metadata": map[string]any{"labels": map[string]any{key: ""}}})
}

func annotatePatch(t *testing.T, key string) []byte {
	return mergePatch(t, map[string]any{"metadata": map[string]any{"annotations": map[string]any{key: "x"}}})
}

func untaintPatch(t *testing.T) []byte {
	return mergePatch(t, map[string]any{"spec": map[string]any{"taints": nil}})
}

func unlabelPatch(t *testing.T) []byte {
	return mergePatch(t, map[string]any{"metadata": map[string]any{"labels": map[string]any{controlPlaneLabel: nil}}})
}

// masterSecretMirrorPod is a mirror pod on worker-0 that mounts the
// master secret.
func masterSecretMirrorPod() *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "steal-worker-0", Namespace: "kube-system", Annotations: map[string]string{corev1.MirrorPodAnnotationKey: "x"}},
		Spec: corev1.PodSpec{NodeName: "worker-0", Containers: []corev1.Container{{Name: "c", Image: "x",
			VolumeMounts: []corev1.VolumeMount{{Name: "s", MountPath: "/s"}}}},
			Volumes: []corev1.Volume{{Name: "s", VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{SecretName: "orrery-master-secret"}}}}},
	}
}

// workerWrites are the writes TestWorkerCannotPlaceSecretHoldingPods
// tries with a worker's credentials; only those allowed may pass.
var workerWrites = map[string]struct {
	try     func(t *testing.T, e *nodePolicyEnv) error
	allowed bool
}{
	// flannel's token: nodes/status patches change metadata too.
	"flannel labels its worker a control plane": {try: func(t *testing.T, e *nodePolicyEnv) error {
		return e.patchStatus(e.flannel, "worker-0", labelPatch(t, controlPlaneLabel))
	}},
	"flannel labels its worker with an orrery.dev/ label": {try: func(t *testing.T, e *nodePolicyEnv) error {
		return e.patchStatus(e.flannel, "worker-0", labelPatch(t, "orrery.dev/control-plane"))
	}},
	"flannel adds any label": {try: func(t *testing.T, e *nodePolicyEnv) error {
		return e.patchStatus(e.flannel, "worker-0", labelPatch(t, "example.com/role"))
	}},
	"flannel removes a control plane's label": {try: func(t *testing.T, e *nodePolicyEnv) error {
		return e.patchStatus(e.flannel, "cp-0", unlabelPatch(t))
	}},
	"flannel removes a control plane's taint": {try: func(t *testing.T, e *nodePolicyEnv) error {
		return e.patchStatus(e.flannel, "cp-0", untaintPatch(t))
	}},
	"flannel changes an annotation not its own": {try: func(t *testing.T, e *nodePolicyEnv) error {
		return e.patchStatus(e.flannel, "worker-0", annotatePatch(t, "example.com/x"))
	}},
	"flannel writes another node's flannel annotations": {try: func(t *testing.T, e *nodePolicyEnv) error {
		return e.patchStatus(e.flannel, "cp-0", annotatePatch(t, "flannel.alpha.coreos.com/public-ip"))
	}},
	"flannel changes its node's addresses": {try: func(t *testing.T, e *nodePolicyEnv) error {
		return e.patchStatus(e.flannel, "worker-0", mergePatch(t, map[string]any{"status": map[string]any{"addresses": []any{
			map[string]any{"type": "InternalIP", "address": "10.42.1.100"}}}}))
	}},
	"flannel changes its node's kubelet port": {try: func(t *testing.T, e *nodePolicyEnv) error {
		return e.patchStatus(e.flannel, "worker-0", mergePatch(t, map[string]any{"status": map[string]any{"daemonEndpoints": map[string]any{
			"kubeletEndpoint": map[string]any{"Port": 1}}}}))
	}},
	"flannel adds a finalizer": {try: func(t *testing.T, e *nodePolicyEnv) error {
		return e.patchStatus(e.flannel, "worker-0", mergePatch(t, map[string]any{"metadata": map[string]any{"finalizers": []any{"example.com/keep"}}}))
	}},
	"flannel patches the node, not its status": {try: func(t *testing.T, e *nodePolicyEnv) error {
		return e.patchNode(e.flannel, "worker-0", labelPatch(t, controlPlaneLabel))
	}},
	"flannel records its subnet": {allowed: true, try: func(t *testing.T, e *nodePolicyEnv) error {
		return e.patchStatus(e.flannel, "worker-0", annotatePatch(t, "flannel.alpha.coreos.com/public-ip"))
	}},
	"flannel clears NetworkUnavailable": {allowed: true, try: func(t *testing.T, e *nodePolicyEnv) error {
		return e.patchStatus(e.flannel, "worker-0", mergePatch(t, map[string]any{"status": map[string]any{"conditions": []any{
			map[string]any{"type": "NetworkUnavailable", "status": "False", "reason": "FlannelIsUp"}}}}))
	}},
	// The worker's kubelet certificate.
	"kubelet labels its node a control plane": {try: func(t *testing.T, e *nodePolicyEnv) error {
		return e.patchNode(e.worker, "worker-0", labelPatch(t, controlPlaneLabel))
	}},
	"kubelet labels its node with an orrery.dev/ label": {try: func(t *testing.T, e *nodePolicyEnv) error {
		return e.patchNode(e.worker, "worker-0", labelPatch(t, "orrery.dev/control-plane"))
	}},
	"kubelet labels a control plane's node": {try: func(t *testing.T, e *nodePolicyEnv) error {
		return e.patchNode(e.worker, "cp-0", labelPatch(t, "example.com/x"))
	}},
	"kubelet removes a control plane's taint": {try: func(t *testing.T, e *nodePolicyEnv) error {
		return e.patchNode(e.worker, "cp-0", untaintPatch(t))
	}},
	"kubelet reads the master secret": {try: func(_ *testing.T, e *nodePolicyEnv) error {
		_, err := e.worker.CoreV1().Secrets("kube-system").Get(e.ctx, "orrery-master-secret", metav1.GetOptions{})
		return err
	}},
	"kubelet creates a mirror pod that mounts the master secret": {try: func(_ *testing.T, e *nodePolicyEnv) error {
		_, err := e.worker.CoreV1().Pods("kube-system").Create(e.ctx, masterSecretMirrorPod(), metav1.CreateOptions{})
		return err
	}},
	"kubelet deletes a control plane's node": {try: func(_ *testing.T, e *nodePolicyEnv) error {
		return e.worker.CoreV1().Nodes().Delete(e.ctx, "cp-0", metav1.DeleteOptions{})
	}},
	"kubelet labels its node as kubelets may": {allowed: true, try: func(t *testing.T, e *nodePolicyEnv) error {
		return e.patchNode(e.worker, "worker-0", labelPatch(t, "example.com/zone"))
	}},
}

// TestWorkerCannotPlaceSecretHoldingPods tries, with every credential root
// on a worker holds (its kubelet's certificate, flannel's token), to make
// the join service's pod, which mounts the master secret and the cluster
// CA keys, run on the worker, or to read those secrets otherwise, against
// a real API server with the charts' policies, the Node authorizer and
// NodeRestriction, as kubeadm sets it up. The writes flannel and kubelets
// need still pass.
func TestWorkerCannotPlaceSecretHoldingPods(t *testing.T) {
	e := newNodePolicyEnv(t)
	waitForPolicies(t, e.worker, "worker-0")

	names := make([]string, 0, len(workerWrites))
	for name := range workerWrites {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		tc := workerWrites[name]
		t.Run(name, func(t *testing.T) {
			err := tc.try(t, e)
			switch {
			case tc.allowed && err != nil:
				t.Fatalf("refused: %v", err)
			case !tc.allowed && err == nil:
				t.Fatal("allowed")
			case !tc.allowed && !apierrors.IsForbidden(err) && !apierrors.IsInvalid(err):
				t.Fatalf("refused, but not as forbidden: %v", err)
			}
		})
	}

	// Last, as it changes the nodes: a kubelet that deletes its own Node
	// and registers it again cannot come back labelled.
	t.Run("kubelet re-registers its node as a control plane", func(t *testing.T) {
		if err := e.worker.CoreV1().Nodes().Delete(e.ctx, "worker-0", metav1.DeleteOptions{}); err != nil && !apierrors.IsForbidden(err) {
			t.Fatal(err)
		}
		_ = e.admin.CoreV1().Nodes().Delete(e.ctx, "worker-0", metav1.DeleteOptions{})
		for _, key := range []string{controlPlaneLabel, "orrery.dev/control-plane"} {
			_, err := e.worker.CoreV1().Nodes().Create(e.ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "worker-0", Labels: map[string]string{key: ""}}}, metav1.CreateOptions{})
			if err == nil || !apierrors.IsForbidden(err) {
				t.Errorf("registering with label %s: err = %v, want forbidden", key, err)
			}
		}
	})
	// The cluster admins keep the say over roles.
	t.Run("an admin labels a node", func(t *testing.T) {
		if err := e.patchNode(e.admin, "cp-0", labelPatch(t, "orrery.dev/example")); err != nil {
			t.Fatal(err)
		}
	})
}

// waitForPolicies waits until the charts' admission policies are in force
// (the API server loads them asynchronously): until a dry run of a write
// the node-role policy refuses, by kubelet, is refused. Type errors in a
// policy's expressions show as refusals of the writes that must pass.
func waitForPolicies(t *testing.T, kubelet kubernetes.Interface, node string) {
	t.Helper()
	probe := mergePatch(t, map[string]any{"metadata": map[string]any{"labels": map[string]any{"orrery.dev/probe": ""}}})
	deadline := time.Now().Add(30 * time.Second)
	for {
		_, err := kubelet.CoreV1().Nodes().Patch(context.Background(), node, types.MergePatchType, probe, metav1.PatchOptions{DryRun: []string{metav1.DryRunAll}})
		if apierrors.IsForbidden(err) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the orrery-node-roles policy is not in force after 30 s: a kubelet's orrery.dev/ label: %v", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// manifestObject is what the static checks read of a rendered object.
type manifestObject struct {
	Kind     string
	Metadata struct{ Name, Namespace string }
	Spec     struct {
		Template struct {
			Spec struct {
				ServiceAccountName string            `json:"serviceAccountName"`
				NodeSelector       map[string]string `json:"nodeSelector"`
				Volumes            []struct {
					Name     string
					Secret   *struct{ SecretName string } `json:"secret"`
					HostPath *struct{ Path string }       `json:"hostPath"`
				}
			}
		}
	}
	// Roles and bindings.
	Rules []struct {
		APIGroups []string `json:"apiGroups"`
		Resources []string
		Verbs     []string
	}
	RoleRef  struct{ Kind, Name string } `json:"roleRef"`
	Subjects []struct{ Kind, Name, Namespace string }
}

// renderedObjects renders every embedded chart and parses its objects.
func renderedObjects(t *testing.T) ([]manifestObject, string) {
	t.Helper()
	var objs []manifestObject
	var all strings.Builder
	for _, name := range Names {
		values := map[string]any{}
		switch name {
		case Flannel:
			values = flannelValues()
		case OrreryServices:
			values = servicesValues()
		}
		for _, manifest := range render(t, name, values) {
			all.WriteString(manifest)
			for _, doc := range strings.Split(manifest, "\n---") {
				var o manifestObject
				if err := yaml.Unmarshal([]byte(doc), &o); err != nil {
					t.Fatalf("%s: %v", name, err)
				}
				if o.Kind != "" {
					objs = append(objs, o)
				}
			}
		}
	}
	return objs, all.String()
}

// protectedPrefixes are the label prefixes the orrery-node-roles policy
// keeps for cluster admins, read from the rendered policy.
func protectedPrefixes(t *testing.T) []string {
	t.Helper()
	for _, manifest := range render(t, OrreryServices, servicesValues()) {
		var p struct {
			Kind     string
			Metadata struct{ Name string }
			Spec     struct {
				Variables []struct{ Name, Expression string }
			}
		}
		for _, doc := range strings.Split(manifest, "\n---") {
			if yaml.Unmarshal([]byte(doc), &p) != nil || p.Kind != "ValidatingAdmissionPolicy" || p.Metadata.Name != "orrery-node-roles" {
				continue
			}
			for _, v := range p.Spec.Variables {
				if v.Name == "isProtected" {
					var prefixes []string
					if err := json.Unmarshal([]byte(strings.ReplaceAll(v.Expression, "'", `"`)), &prefixes); err != nil {
						t.Fatalf("isProtected is not a list of strings: %v", err)
					}
					return prefixes
				}
			}
		}
	}
	t.Fatal("no orrery-node-roles policy with an isProtected list in the orrery-services chart")
	return nil
}

// serviceAccountWrites is what each service account in objs may write,
// as "resource:verb", by the roles its bindings name.
func serviceAccountWrites(objs []manifestObject) map[string][]string {
	roles := map[string][]string{} // "ClusterRole/name" -> writes
	for _, o := range objs {
		if o.Kind != "ClusterRole" && o.Kind != "Role" {
			continue
		}
		for _, r := range o.Rules {
			for _, v := range r.Verbs {
				if v == "get" || v == "list" || v == "watch" {
					continue
				}
				for _, res := range r.Resources {
					roles[o.Kind+"/"+o.Metadata.Name] = append(roles[o.Kind+"/"+o.Metadata.Name], res+":"+v)
				}
			}
		}
	}
	writes := map[string][]string{} // service account -> writes
	for _, o := range objs {
		if o.Kind != "ClusterRoleBinding" && o.Kind != "RoleBinding" {
			continue
		}
		for _, s := range o.Subjects {
			if s.Kind == "ServiceAccount" {
				writes[s.Name] = append(writes[s.Name], roles[o.RoleRef.Kind+"/"+o.RoleRef.Name]...)
			}
		}
	}
	return writes
}

// TestWorkerPodsWriteOnlyWhatTheyOwn reads the rendered charts as an
// attacker with root on a worker would: which service accounts have pods
// that can run on a worker (their tokens are on it), and what each may
// write. A new one, or a new write, must be looked at for what it lets a
// compromised worker do, and added here. And every pod that mounts a
// Secret or the host's PKI is placed only by labels that the
// orrery-node-roles policy keeps for cluster admins.
func TestWorkerPodsWriteOnlyWhatTheyOwn(t *testing.T) {
	objs, _ := renderedObjects(t)
	prefixes := protectedPrefixes(t)
	protected := func(key string) bool {
		for _, p := range prefixes {
			if strings.HasPrefix(key, p) {
				return true
			}
		}
		return false
	}

	writes := serviceAccountWrites(objs)

	onWorkers := map[string][]string{}
	for _, o := range objs {
		switch o.Kind {
		case "DaemonSet", "Deployment", "StatefulSet", "ReplicaSet", "Job", "CronJob":
		default:
			continue
		}
		pod := o.Spec.Template.Spec
		placedByAdmins := false
		for key := range pod.NodeSelector {
			placedByAdmins = placedByAdmins || protected(key)
		}
		for key := range pod.NodeSelector {
			if !protected(key) && placedByAdmins {
				t.Errorf("%s %s: node selector %s is not a label only cluster admins set; select on node-role.kubernetes.io/ labels", o.Kind, o.Metadata.Name, key)
			}
		}
		for _, v := range pod.Volumes {
			holdsSecrets := v.Secret != nil || (v.HostPath != nil && strings.HasPrefix(v.HostPath.Path, "/etc/kubernetes/pki"))
			if holdsSecrets && !placedByAdmins {
				t.Errorf("%s %s mounts %s and can run on a worker: place it with a node-role.kubernetes.io/ label", o.Kind, o.Metadata.Name, v.Name)
			}
		}
		if !placedByAdmins {
			sa := pod.ServiceAccountName
			if sa == "" {
				sa = "default"
			}
			w := append([]string(nil), writes[sa]...)
			sort.Strings(w)
			onWorkers[sa] = w
		}
	}
	want := map[string][]string{"flannel": {"nodes/status:patch"}}
	got, _ := json.Marshal(onWorkers)
	wantJSON, _ := json.Marshal(want)
	if string(got) != string(wantJSON) {
		t.Errorf("service accounts of pods that can run on a worker, and what they may write: %s, want %s", got, wantJSON)
	}
	// flannel's one write is narrowed by a policy of its own.
	if _, all := renderedObjects(t); !strings.Contains(all, "name: orrery-flannel-node-writes") {
		t.Error("no orrery-flannel-node-writes policy narrows flannel's nodes/status patches")
	}
}

// removalEnv is an API server with the charts installed, worker-0 and
// worker-1 registered by their kubelets, and worker-1's disk admitted.
type removalEnv struct {
	ctx   context.Context
	admin kubernetes.Interface
	dyn   dynamic.Interface
	// removed is worker-1's kubelet, other worker-0's.
	removed kubernetes.Interface
	other   kubernetes.Interface
	out     *strings.Builder
	cfg     noderemove.Config
}

func newRemovalEnv(t *testing.T) *removalEnv {
	t.Helper()
	srv := apiservertest.Start(t)
	installCharts(t, srv)
	ctx := context.Background()
	admin := clientFor(t, srv.Config)
	dyn := srv.Dynamic(t)
	removed := clientFor(t, srv.ConfigAs(t, "system:node:worker-1", "system:nodes"))
	other := clientFor(t, srv.ConfigAs(t, "system:node:worker-0", "system:nodes"))
	for name, c := range map[string]kubernetes.Interface{"worker-1": removed, "worker-0": other} {
		if _, err := c.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	waitForPolicies(t, other, "worker-0")
	if _, err := dyn.Resource(admittedNodes).Create(ctx, &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": orreryapi.APIVersion, "kind": orreryapi.AdmittedNodeKind, "metadata": map[string]any{"name": "disk-" + disk},
		"spec": map[string]any{"diskUUID": disk, "instance": map[string]any{"name": "worker-1", "id": "4711"}},
	}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// A pod of the owner's on the node, which the drain evicts.
	pod, err := admin.CoreV1().Pods("default").Create(ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "app"},
		Spec: corev1.PodSpec{NodeName: "worker-1", Containers: []corev1.Container{{Name: "c", Image: "x"}}}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	// Finished, so that its deletion needs no kubelet here.
	pod.Status.Phase = corev1.PodSucceeded
	if _, err := admin.CoreV1().Pods("default").UpdateStatus(ctx, pod, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}

	var out strings.Builder
	cfg := noderemove.Config{Client: admin, Dynamic: dyn, Out: &out, DrainTimeout: 10 * time.Second}
	return &removalEnv{ctx: ctx, admin: admin, dyn: dyn, removed: removed, other: other, out: &out, cfg: cfg}
}

// TestRemovedNodeCannotComeBack removes a worker as 'orrery node remove'
// does, against a real API server with the charts installed, then tries
// what the removed node's kubelet certificate could do to come back:
// re-create its Node, renew its certificate, post a pod. Every write is
// refused; another node's are not.
func TestRemovedNodeCannotComeBack(t *testing.T) {
	e := newRemovalEnv(t)
	checkRemovesWorker(t, e)
	checkRemovedNodeIsRefused(t, e)
	checkControlPlaneRemoval(t, e)
}

// checkRemovesWorker removes worker-1 and checks what the removal left.
func checkRemovesWorker(t *testing.T, e *removalEnv) {
	t.Helper()
	if err := noderemove.Remove(e.ctx, e.cfg, "worker-1"); err != nil {
		t.Fatalf("remove: %v\n%s", err, e.out.String())
	}
	for _, want := range []string{"marked removed", "cordoned", "drained", "deleted", "gets no join or rejoin ticket again"} {
		if !strings.Contains(e.out.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, e.out.String())
		}
	}
	rec, err := e.dyn.Resource(admittedNodes).Get(e.ctx, "disk-"+disk, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if at, _, _ := unstructured.NestedString(rec.Object, "spec", "removedAt"); at == "" {
		t.Error("the disk's record is not marked removed")
	}
	cm, err := e.admin.CoreV1().ConfigMaps(removednodes.Namespace).Get(e.ctx, removednodes.ConfigMapName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if l, err := removednodes.Parse(cm.Data); err != nil || l["worker-1"].InstanceID != "4711" {
		t.Errorf("removed list = %v, %v; want worker-1 with its instance", l, err)
	}
	if _, err := e.admin.CoreV1().Nodes().Get(e.ctx, "worker-1", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("the node is still there: %v", err)
	}
}

// checkRemovedNodeIsRefused tries, once worker-1 is removed, what its
// kubelet certificate could do to come back, and what worker-0's may.
func checkRemovedNodeIsRefused(t *testing.T, e *removalEnv) {
	t.Helper()
	ctx := e.ctx
	csr := func(c kubernetes.Interface, name string) error {
		_, err := c.CertificatesV1().CertificateSigningRequests().Create(ctx, &certificatesv1.CertificateSigningRequest{
			ObjectMeta: metav1.ObjectMeta{GenerateName: "node-csr-"},
			Spec: certificatesv1.CertificateSigningRequestSpec{Request: csrPEM(t, "system:node:"+name),
				SignerName: certificatesv1.KubeAPIServerClientKubeletSignerName,
				Usages:     []certificatesv1.KeyUsage{certificatesv1.UsageDigitalSignature, certificatesv1.UsageClientAuth}},
		}, metav1.CreateOptions{})
		return err
	}
	tries := map[string]func() error{
		"re-create its Node": func() error {
			_, err := e.removed.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "worker-1"}}, metav1.CreateOptions{})
			return err
		},
		"renew its certificate": func() error { return csr(e.removed, "worker-1") },
		"post a mirror pod": func() error {
			_, err := e.removed.CoreV1().Pods("default").Create(ctx, &corev1.Pod{
				ObjectMeta: metav1.ObjectMeta{Name: "static-worker-1", Annotations: map[string]string{corev1.MirrorPodAnnotationKey: "x"}},
				Spec:       corev1.PodSpec{NodeName: "worker-1", Containers: []corev1.Container{{Name: "c", Image: "x"}}}}, metav1.CreateOptions{})
			return err
		},
	}
	for what, try := range tries {
		if err := try(); !apierrors.IsForbidden(err) {
			t.Errorf("the removed node tried to %s: err = %v, want forbidden", what, err)
		} else if what == "re-create its Node" && !strings.Contains(err.Error(), "was removed from the cluster") {
			t.Errorf("the refusal does not say why: %v", err)
		}
	}
	// Other nodes go on as before.
	if err := csr(e.other, "worker-0"); err != nil {
		t.Errorf("another node renewing its certificate: %v", err)
	}
	if err := patchLabel(ctx, e.other, "worker-0", "example.com/zone"); err != nil {
		t.Errorf("another node writing its Node: %v", err)
	}
}

// fakeControlPlane is another control plane's upgrade service, which
// answers every removal of an etcd member with refusal, or removes it.
type fakeControlPlane struct {
	refusal error
	asked   *[]string
}

func (f fakeControlPlane) RemoveEtcdMember(_ context.Context, name, address string, breakQuorum bool) ([]kubeupgrade.EtcdMember, error) {
	*f.asked = append(*f.asked, fmt.Sprintf("%s@%s quorum=%v", name, address, breakQuorum))
	if f.refusal != nil {
		return nil, f.refusal
	}
	return []kubeupgrade.EtcdMember{{Name: "cp-0", Healthy: true}}, nil
}

// The refusals another control plane's upgrade service gives.
var (
	quorumRefusal = kubeupgradepb.Refusal(codes.FailedPrecondition, kubeupgradepb.ReasonQuorum,
		"etcd would lose its quorum: 2 voting members would be left, 1 of them healthy, and 2 must be")
	askAnother   = kubeupgradepb.Refusal(codes.FailedPrecondition, kubeupgradepb.ReasonAskAnother, "this node is no control plane: it runs no etcd member")
	twoNamedSame = status.Error(codes.FailedPrecondition, "etcd has 2 members named cp-1: remove the wrong one with etcdctl")
)

func (fakeControlPlane) Close() error { return nil }

// checkControlPlaneRemoval removes control planes, with and without a
// Node: the last one is refused, so is one whose etcd member another
// control plane will not let go; one that goes loses its member first,
// then its approval, then the rest of what a worker loses.
func checkControlPlaneRemoval(t *testing.T, e *removalEnv) {
	t.Helper()
	ctx, cfg := e.ctx, e.cfg
	var dialled, asked []string
	var refusal error
	cfg.DialControlPlane = func(_ context.Context, name, addr string) (noderemove.ControlPlane, error) {
		dialled = append(dialled, name+"@"+addr)
		return fakeControlPlane{refusal: refusal, asked: &asked}, nil
	}
	cp := func(name, ip string) {
		n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{controlPlaneLabel: ""}}}
		n, err := e.admin.CoreV1().Nodes().Create(ctx, n, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		n.Status.Addresses = []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: ip}}
		if _, err := e.admin.CoreV1().Nodes().UpdateStatus(ctx, n, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	cp("cp-0", "10.42.1.100")
	if err := noderemove.Remove(ctx, cfg, "cp-0"); !errors.Is(err, noderemove.ErrLastControlPlane) || len(dialled) > 0 {
		t.Errorf("removing the last control plane: %v (dialled %v), want ErrLastControlPlane before any other is asked", err, dialled)
	}
	if err := noderemove.Remove(ctx, cfg, "worker-9"); err == nil || !strings.Contains(err.Error(), "no node worker-9") {
		t.Errorf("removing a node nobody knows: %v", err)
	}

	// cp-1, approved as instance 5150.
	const cpDisk = "0f9c3a51-7d2e-4b8a-9e61-2c5d8f0a7b34"
	if _, err := e.dyn.Resource(admittedNodes).Create(ctx, &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": orreryapi.APIVersion, "kind": orreryapi.AdmittedNodeKind, "metadata": map[string]any{"name": "disk-" + cpDisk},
		"spec": map[string]any{"diskUUID": cpDisk, "instance": map[string]any{"name": "cp-1", "id": "5150"}},
	}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.admin.CoreV1().ConfigMaps(controlplanes.Namespace).Create(ctx, &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Name: controlplanes.ConfigMapName, Namespace: controlplanes.Namespace},
		Data:       map[string]string{controlplanes.Key: "5150"},
	}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	cp("cp-1", "10.42.1.101")
	// A cluster set up without a load balancer: cp-0's address is its
	// endpoint, and cp-0 cannot go, whatever etcd says.
	endpoint := func(ep string) {
		cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: kubeadmconfig.ConfigMapName, Namespace: kubeadmconfig.Namespace},
			Data: map[string]string{"ClusterConfiguration": "kind: ClusterConfiguration\ncontrolPlaneEndpoint: " + ep + "\n"}}
		if _, err := e.admin.CoreV1().ConfigMaps(kubeadmconfig.Namespace).Update(ctx, cm, metav1.UpdateOptions{}); apierrors.IsNotFound(err) {
			_, err = e.admin.CoreV1().ConfigMaps(kubeadmconfig.Namespace).Create(ctx, cm, metav1.CreateOptions{})
			if err != nil {
				t.Fatal(err)
			}
		} else if err != nil {
			t.Fatal(err)
		}
	}
	endpoint("10.42.1.100:6443")
	if err := noderemove.Remove(ctx, cfg, "cp-0"); err == nil || !strings.Contains(err.Error(), "is the cluster's control-plane endpoint") || len(dialled) > 0 {
		t.Errorf("removing the control plane that is the endpoint: %v (dialled %v)", err, dialled)
	}
	endpoint("10.42.0.2:6443")
	checkQuorumAndRemoval(t, e, cfg, &refusal, &dialled, &asked)
}

// checkQuorumAndRemoval: cp-1, whose etcd member cp-0 will not remove, is
// refused with nothing changed, and the flag that forces it is named only
// when it would help; forced, it goes, approval and all, and the rest of
// the removal talks to cp-0's API server.
func checkQuorumAndRemoval(t *testing.T, e *removalEnv, cfg noderemove.Config, refusal *error, dialled, asked *[]string) {
	t.Helper()
	ctx := e.ctx
	const cpDisk = "0f9c3a51-7d2e-4b8a-9e61-2c5d8f0a7b34"
	recordRemoved := func() bool {
		rec, err := e.dyn.Resource(admittedNodes).Get(ctx, "disk-"+cpDisk, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		at, _, _ := unstructured.NestedString(rec.Object, "spec", "removedAt")
		return at != ""
	}
	approved := func() string {
		cm, err := e.admin.CoreV1().ConfigMaps(controlplanes.Namespace).Get(ctx, controlplanes.ConfigMapName, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return cm.Data[controlplanes.Key]
	}

	// Another control plane refuses: etcd would lose its quorum.
	*refusal = quorumRefusal
	err := noderemove.Remove(ctx, cfg, "cp-1")
	if err == nil || !strings.Contains(err.Error(), "lose its quorum") || !strings.Contains(err.Error(), "--break-etcd-quorum") {
		t.Errorf("removing a control plane etcd cannot lose: %v, want the refusal and the flag that forces it", err)
	}
	if want := []string{"cp-0@10.42.1.100"}; !slices.Equal(*dialled, want) {
		t.Errorf("dialled %v, want %v: the member goes through another control plane", *dialled, want)
	}
	checkRefusalsWithoutTheFlag(t, e, cfg, refusal)
	if recordRemoved() || !strings.Contains(approved(), "5150") {
		t.Error("a refused removal marked the control plane's disk removed or revoked its approval")
	}

	// Forced, or with a quorum to spare, it goes.
	*refusal, *asked = nil, nil
	cfg.BreakQuorum = true
	var direct []string
	cfg.Direct = func(addr string) (kubernetes.Interface, dynamic.Interface, error) {
		direct = append(direct, addr)
		return e.admin, e.dyn, nil
	}
	var removed []string
	cfg.Removed = func(name string, ids []string) { removed = append(removed, name+"="+strings.Join(ids, ",")) }
	if err := noderemove.Remove(ctx, cfg, "cp-1"); err != nil {
		t.Fatalf("removing cp-1: %v\n%s", err, e.out.String())
	}
	if !slices.Equal(direct, []string{"10.42.1.100"}) || !slices.Equal(removed, []string{"cp-1=5150"}) {
		t.Errorf("the removal went on at %v and told the owner's records %v; want cp-0's API server and cp-1=5150", direct, removed)
	}
	if want := []string{"cp-1@10.42.1.101 quorum=true"}; !slices.Equal(*asked, want) {
		t.Errorf("asked %v, want %v", *asked, want)
	}
	if !recordRemoved() || strings.Contains(approved(), "5150") {
		t.Errorf("after the removal: disk marked removed %v, approved %q; want it marked and 5150 revoked", recordRemoved(), approved())
	}
	if _, err := e.admin.CoreV1().Nodes().Get(ctx, "cp-1", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("cp-1's Node is still there: %v", err)
	}
	for _, want := range []string{"node cp-1: its etcd member is removed (through cp-0)", "instance 5150 is no longer an approved control plane"} {
		if !strings.Contains(e.out.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, e.out.String())
		}
	}

	// Without a way to reach the others, no control plane goes.
	cfg.DialControlPlane = nil
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "cp-2", Labels: map[string]string{controlPlaneLabel: ""}}}
	if _, err := e.admin.CoreV1().Nodes().Create(ctx, n, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := noderemove.Remove(ctx, cfg, "cp-2"); err == nil || !strings.Contains(err.Error(), "cannot reach the others") {
		t.Errorf("removing a control plane without reaching the others: %v", err)
	}
}

// checkRefusalsWithoutTheFlag: refusals that --break-etcd-quorum cannot
// get past do not name it.
func checkRefusalsWithoutTheFlag(t *testing.T, e *removalEnv, cfg noderemove.Config, refusal *error) {
	t.Helper()
	for _, r := range []error{twoNamedSame, askAnother} {
		*refusal = r
		if err := noderemove.Remove(e.ctx, cfg, "cp-1"); err == nil || !strings.Contains(err.Error(), status.Convert(r).Message()) || strings.Contains(err.Error(), "--break-etcd-quorum") {
			t.Errorf("another control plane answering %v: %v, want that refusal without the flag", r, err)
		}
	}
}

func patchLabel(ctx context.Context, c kubernetes.Interface, node, key string) error {
	_, err := c.CoreV1().Nodes().Patch(ctx, node, types.MergePatchType, fmt.Appendf(nil, `{"metadata":{"labels":{%q:""}}}`, key), metav1.PatchOptions{})
	return err
}

// csrPEM is a PEM certificate request for common name cn in system:nodes.
func csrPEM(t *testing.T, cn string) []byte {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	der, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{Subject: pkix.Name{CommonName: cn, Organization: []string{"system:nodes"}}}, key)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: der})
}
