package upgradeserver

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/orrery-dev/orrery/bootstrapperd/internal/kubeadm"
	"github.com/orrery-dev/orrery/bootstrapperd/internal/kubeadm/kubeadmtest"
	"github.com/orrery-dev/orrery/internal/proto/kubeupgradepb"
	"github.com/orrery-dev/orrery/internal/records/servingca"
	"github.com/orrery-dev/orrery/internal/testkit/apiservertest"
	"github.com/orrery-dev/orrery/internal/versions"
)

// staticPodKubelet stands for kubelet's static pods: it keeps a mirror
// pod per manifest in dir, with the manifest's hash, Ready.
type staticPodKubelet struct {
	client kubernetes.Interface
	dir    string
	node   string
}

func (k staticPodKubelet) sync(ctx context.Context, t *testing.T) {
	for _, c := range kubeadm.StaticPods {
		b, err := os.ReadFile(filepath.Join(k.dir, c+".yaml"))
		if err != nil {
			continue
		}
		sum := sha256.Sum256(b)
		hash := hex.EncodeToString(sum[:8])
		pods := k.client.CoreV1().Pods(metav1.NamespaceSystem)
		pod, err := pods.Get(ctx, c+"-"+k.node, metav1.GetOptions{})
		if err != nil {
			pod = &corev1.Pod{
				ObjectMeta: metav1.ObjectMeta{Name: c + "-" + k.node, Namespace: metav1.NamespaceSystem},
				Spec:       corev1.PodSpec{NodeName: k.node, Containers: []corev1.Container{{Name: c, Image: "registry.k8s.io/" + c}}},
			}
			if pod, err = pods.Create(ctx, pod, metav1.CreateOptions{}); err != nil {
				t.Errorf("create the mirror pod of %s: %v", c, err)
				return
			}
		}
		if pod.Annotations[configHash] == hash {
			continue
		}
		pod.Annotations = map[string]string{configHash: hash}
		if pod, err = pods.Update(ctx, pod, metav1.UpdateOptions{}); err != nil {
			continue // a conflict: the next round
		}
		pod.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}
		_, _ = pods.UpdateStatus(ctx, pod, metav1.UpdateOptions{})
	}
}

func (k staticPodKubelet) run(ctx context.Context, t *testing.T) {
	for ctx.Err() == nil {
		k.sync(ctx, t)
		time.Sleep(100 * time.Millisecond)
	}
}

// movingControlPlane serves control plane cp-0 of a cluster made before
// the kubelet-serving CA: static pods real kubeadm wrote, a real API
// server with kubeadm's configuration of such a cluster, and kubelet's
// static pods stood for.
func movingControlPlane(t *testing.T) (kubeupgradepb.KubernetesUpgradeServiceClient, Config, kubernetes.Interface) {
	t.Helper()
	manifests := kubeadmtest.KeptPodsWithClusterCA(t, versions.Default)
	t.Setenv("PATH", filepath.Dir(apiservertest.Kubeadm(t))+string(os.PathListSeparator)+os.Getenv("PATH"))
	srv := apiservertest.Start(t)
	client := kubernetes.NewForConfigOrDie(srv.Config)
	ctx := t.Context()
	cfg, err := kubeadm.InitConfig(kubeadm.InitParams{NodeName: "cp-0", NodeIP: kubeadmtest.NodeIP, KubernetesVersion: versions.Default, ServiceCIDR: "10.96.0.0/12"})
	if err != nil {
		t.Fatal(err)
	}
	var cc string
	for doc := range strings.SplitSeq(string(cfg), "---\n") {
		if strings.Contains(doc, "kind: ClusterConfiguration") {
			cc = doc
		}
	}
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: kubeadmConfigMap, Namespace: metav1.NamespaceSystem}, Data: map[string]string{clusterConfigKey: cc}}
	if _, err := client.CoreV1().ConfigMaps(metav1.NamespaceSystem).Create(ctx, cm, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	kl := staticPodKubelet{client: client, dir: manifests, node: "cp-0"}
	kl.sync(ctx, t)
	kctx, stop := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); kl.run(kctx, t) }()
	t.Cleanup(func() { stop(); <-done })

	dir := t.TempDir()
	c := Config{
		Kubeadm:   &kubeadm.Tool{Runner: kubeadm.ExecRunner{}, ConfigDir: filepath.Join(dir, "run")},
		Manifests: manifests, KubeletConfig: filepath.Join(dir, "kubelet.conf"),
		PKIDir: filepath.Join(dir, "pki"), KubeletPKI: filepath.Join(dir, "kubelet-pki"),
		Cluster: func() (kubernetes.Interface, error) { return client, nil },
		PodWait: time.Minute, Log: slog.New(slog.DiscardHandler),
	}
	return serve(t, New(c)), c, client
}

// A control plane of a cluster made before the kubelet-serving CA takes
// the pair, names it in the cluster's kubeadm configuration and in its
// API server's and controller manager's pods, and answers once they run
// again; asked again it changes nothing, and it refuses another pair.
func TestMoveKubeletServingCA(t *testing.T) {
	client, cfg, kube := movingControlPlane(t)
	ctx := t.Context()
	cert, key, err := servingca.New(time.Now())
	if err != nil {
		t.Fatal(err)
	}
	before, _ := kubeadm.KeptSettings(cfg.Manifests)
	if before.KubeletServingCA {
		t.Fatal("the kept pods name the kubelet-serving CA before the move: the test checks nothing")
	}
	resp, err := client.MoveKubeletServingCA(ctx, &kubeupgradepb.MoveKubeletServingCARequest{Certificate: cert, Key: key})
	if err != nil {
		t.Fatal(err)
	}
	if got, want := resp.GetRewrote(), []string{"kube-apiserver", "kube-controller-manager"}; !slices.Equal(got, want) {
		t.Errorf("rewrote %v, want %v", got, want)
	}
	after, err := kubeadm.KeptSettings(cfg.Manifests)
	if err != nil || !after.KubeletServingCA {
		t.Fatalf("after the move the kept pods say KubeletServingCA %t, %v", after.KubeletServingCA, err)
	}
	if got, _ := os.ReadFile(filepath.Join(cfg.PKIDir, kubeadm.KubeletServingCAKey)); !bytes.Equal(got, key) {
		t.Error("the control plane does not keep the pair's key")
	}
	cm, err := kube.CoreV1().ConfigMaps(metav1.NamespaceSystem).Get(ctx, kubeadmConfigMap, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if _, changed, err := kubeadm.MoveClusterConfiguration([]byte(cm.Data[clusterConfigKey])); err != nil || changed {
		t.Errorf("the cluster's kubeadm configuration after the move: still to move %t, %v", changed, err)
	}

	resp, err = client.MoveKubeletServingCA(ctx, &kubeupgradepb.MoveKubeletServingCARequest{Certificate: cert, Key: key})
	if err != nil || len(resp.GetRewrote()) != 0 {
		t.Errorf("a second move: rewrote %v, %v; want nothing", resp.GetRewrote(), err)
	}
	otherCert, otherKey, err := servingca.New(time.Now())
	if err != nil {
		t.Fatal(err)
	}
	_, err = client.MoveKubeletServingCA(ctx, &kubeupgradepb.MoveKubeletServingCARequest{Certificate: otherCert, Key: otherKey})
	if status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), "another kubelet-serving CA") {
		t.Errorf("a move with another pair: %v, want FailedPrecondition", err)
	}
	_, err = client.MoveKubeletServingCA(ctx, &kubeupgradepb.MoveKubeletServingCARequest{Certificate: cert, Key: otherKey})
	if status.Code(err) != codes.InvalidArgument || strings.Contains(err.Error(), string(otherKey)) {
		t.Errorf("a certificate with another's key: %v, want InvalidArgument without the key", err)
	}
}

// A worker runs no controller manager or API server to move.
func TestMoveKubeletServingCARefusesAWorker(t *testing.T) {
	f := newFixture(t, versions.Default, "")
	cert, key, err := servingca.New(time.Now())
	if err != nil {
		t.Fatal(err)
	}
	_, err = f.client.MoveKubeletServingCA(t.Context(), &kubeupgradepb.MoveKubeletServingCARequest{Certificate: cert, Key: key})
	if status.Code(err) != codes.FailedPrecondition {
		t.Fatalf("a worker's move: %v, want FailedPrecondition", err)
	}
}

// Renewing removes kubelet's serving certificate, not its client
// certificate, and restarts kubelet.
func TestRenewKubeletServingCertificate(t *testing.T) {
	f := newFixture(t, versions.Default, "")
	pki := t.TempDir()
	cfg := f.cfg
	cfg.KubeletPKI = pki
	client := serve(t, New(cfg))
	for _, name := range []string{"kubelet-server-2026-12-01-10-00-00.pem", "kubelet-server-current.pem", "kubelet-client-current.pem", "kubelet.crt"} {
		if err := os.WriteFile(filepath.Join(pki, name), []byte("pem"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := client.RenewKubeletServingCertificate(t.Context(), &kubeupgradepb.RenewKubeletServingCertificateRequest{}); err != nil {
		t.Fatal(err)
	}
	var left []string
	entries, _ := os.ReadDir(pki)
	for _, e := range entries {
		left = append(left, e.Name())
	}
	if want := []string{"kubelet-client-current.pem", "kubelet.crt"}; !slices.Equal(left, want) {
		t.Errorf("kubelet's folder holds %v, want %v", left, want)
	}
	if len(f.kubelet.restarts) != 1 {
		t.Errorf("kubelet restarted %d times, want once", len(f.kubelet.restarts))
	}
}
