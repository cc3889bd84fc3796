package upgradeserver

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/util/retry"

	"github.com/orrery-dev/orrery/bootstrapperd/internal/kubeadm"
	"github.com/orrery-dev/orrery/internal/proto/kubeupgradepb"
	"github.com/orrery-dev/orrery/internal/records/servingca"
)

// kubeadmConfig is the ConfigMap in which kubeadm keeps the cluster's
// configuration, and its key for the ClusterConfiguration.
const (
	kubeadmConfigMap = "kubeadm-config"
	clusterConfigKey = "ClusterConfiguration"
)

// MoveKubeletServingCA implements kubeupgradepb.KubernetesUpgradeServiceServer.
// The pair comes from the owner, who makes it (an init's first control
// plane makes its own); it is kept where the join service hands it to the
// control planes that join later.
func (s *Server) MoveKubeletServingCA(ctx context.Context, req *kubeupgradepb.MoveKubeletServingCARequest) (*kubeupgradepb.MoveKubeletServingCAResponse, error) {
	done, err := s.exclusive("a move to the kubelet-serving CA")
	if err != nil {
		return nil, err
	}
	defer done()
	if !s.controlPlane() {
		return nil, status.Error(codes.FailedPrecondition, "this node is no control plane: only control planes sign and check kubelets' serving certificates")
	}
	now := time.Now()
	if err := servingca.Check(req.GetCertificate(), req.GetKey(), now); err != nil {
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	kept, err := kubeadm.KeptSettings(s.c.Manifests)
	if err != nil {
		return nil, status.Errorf(codes.FailedPrecondition, "%v; see 'orrery logs NODE orrery-static-pods'", err)
	}
	if err := kubeadm.InstallKubeletServingCA(s.c.PKIDir, req.GetCertificate(), req.GetKey(), now); err != nil {
		if errors.Is(err, kubeadm.ErrOtherKubeletServingCA) {
			return nil, status.Errorf(codes.FailedPrecondition, "%v: the other control planes were moved with another pair; move every control plane with the one it holds", err)
		}
		return nil, status.Error(codes.Internal, err.Error())
	}
	client, err := s.c.Cluster()
	if err != nil {
		return nil, status.Errorf(codes.Internal, "reach the API server: %v", err)
	}
	if err := moveClusterConfiguration(ctx, client); err != nil {
		return nil, status.Errorf(codes.Unavailable, "%v; nothing of this control plane's pods changed, ask again", err)
	}
	if kept.KubeletServingCA {
		s.c.Log.Info("this control plane runs with the kubelet-serving CA already")
		return &kubeupgradepb.MoveKubeletServingCAResponse{}, nil
	}
	rewrote, err := s.rewriteForServingCA(ctx, client, kept)
	if err != nil {
		return nil, err
	}
	return &kubeupgradepb.MoveKubeletServingCAResponse{Rewrote: rewrote}, nil
}

// rewriteForServingCA writes the static pods of kept's control plane as
// they are with the kubelet-serving CA, and waits until the pods written
// run again.
func (s *Server) rewriteForServingCA(ctx context.Context, client kubernetes.Interface, kept kubeadm.InitParams) ([]string, error) {
	before := map[string]string{}
	for _, c := range kubeadm.StaticPods {
		before[c] = mirrorHash(ctx, client, c, kept.NodeName)
	}
	kept.KubeletServingCA = true
	var out bytes.Buffer
	pods, err := s.c.Kubeadm.StaticPods(ctx, kept, &out)
	if err != nil {
		return nil, status.Errorf(codes.Internal, "make the static pods with the kubelet-serving CA: %v: %s", err, strings.TrimSpace(out.String()))
	}
	rewrote, err := kubeadm.RewriteStaticPods(s.c.Manifests, pods)
	if err != nil {
		return rewrote, status.Error(codes.Internal, err.Error())
	}
	s.c.Log.Info("rewrote the static pods for the kubelet-serving CA", "pods", strings.Join(rewrote, ", "))
	started := time.Now()
	for _, c := range rewrote {
		if err := waitRestarted(ctx, client, c, kept.NodeName, before[c], s.c.PodWait); err != nil {
			return rewrote, status.Errorf(codes.DeadlineExceeded, "%v; its manifest names the kubelet-serving CA: see 'orrery logs NODE kubelet'", err)
		}
	}
	s.c.Log.Info("the rewritten static pods run", "took", time.Since(started).Round(time.Second).String())
	return rewrote, nil
}

// moveClusterConfiguration has the cluster's kubeadm configuration name
// the kubelet-serving CA, so that kubeadm's later upgrades and joins
// write the control planes' pods with it.
func moveClusterConfiguration(ctx context.Context, client kubernetes.Interface) error {
	cms := client.CoreV1().ConfigMaps(metav1.NamespaceSystem)
	return retry.RetryOnConflict(retry.DefaultRetry, func() error {
		cm, err := cms.Get(ctx, kubeadmConfigMap, metav1.GetOptions{})
		if err != nil {
			return fmt.Errorf("read the cluster's kubeadm configuration: %w", err)
		}
		moved, changed, err := kubeadm.MoveClusterConfiguration([]byte(cm.Data[clusterConfigKey]))
		if err != nil {
			return fmt.Errorf("the cluster's kubeadm configuration (ConfigMap %s/%s): %w", metav1.NamespaceSystem, kubeadmConfigMap, err)
		}
		if !changed {
			return nil
		}
		cm.Data[clusterConfigKey] = string(moved)
		_, err = cms.Update(ctx, cm, metav1.UpdateOptions{})
		return err
	})
}

// configHash is the annotation in which kubelet gives a static pod's
// mirror the hash of the manifest it runs.
const configHash = "kubernetes.io/config.hash"

// mirrorHash is the manifest hash of component's mirror pod on node, or
// "" if it cannot be read.
func mirrorHash(ctx context.Context, client kubernetes.Interface, component, node string) string {
	pod, err := client.CoreV1().Pods(metav1.NamespaceSystem).Get(ctx, component+"-"+node, metav1.GetOptions{})
	if err != nil {
		return ""
	}
	return pod.Annotations[configHash]
}

// waitRestarted waits until component's mirror pod on node runs another
// manifest than the one of hash before, and is Ready.
func waitRestarted(ctx context.Context, client kubernetes.Interface, component, node, before string, wait time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	var last string
	for {
		pod, err := client.CoreV1().Pods(metav1.NamespaceSystem).Get(ctx, component+"-"+node, metav1.GetOptions{})
		switch {
		case err != nil:
			last = err.Error()
		case pod.Annotations[configHash] == before:
			last = "it runs the manifest it ran before"
		case !podReady(pod):
			last = "it is not Ready"
		default:
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%s did not run its new manifest within %s: %s", component, wait, last)
		case <-time.After(2 * time.Second):
		}
	}
}

func podReady(pod *corev1.Pod) bool {
	return slices.ContainsFunc(pod.Status.Conditions, func(c corev1.PodCondition) bool {
		return c.Type == corev1.PodReady && c.Status == corev1.ConditionTrue
	})
}

// RenewKubeletServingCertificate implements kubeupgradepb.KubernetesUpgradeServiceServer.
func (s *Server) RenewKubeletServingCertificate(ctx context.Context, _ *kubeupgradepb.RenewKubeletServingCertificateRequest) (*kubeupgradepb.RenewKubeletServingCertificateResponse, error) {
	done, err := s.exclusive("a renewal of kubelet's serving certificate")
	if err != nil {
		return nil, err
	}
	defer done()
	if _, err := os.Stat(s.c.KubeletConfig); err != nil {
		return nil, status.Errorf(codes.FailedPrecondition, "this node is part of no cluster yet (%v): its kubelet has no serving certificate", err)
	}
	// kubelet keeps its serving certificate as kubelet-server-DATE.pem
	// and a link kubelet-server-current.pem to the newest: without
	// either it asks for a new one when it starts.
	old, err := filepath.Glob(filepath.Join(s.c.KubeletPKI, "kubelet-server-*.pem"))
	if err != nil {
		return nil, status.Error(codes.Internal, err.Error())
	}
	for _, f := range old {
		if err := os.Remove(f); err != nil {
			return nil, status.Errorf(codes.Internal, "remove kubelet's serving certificate: %v", err)
		}
	}
	var out bytes.Buffer
	if err := s.c.Kubelet.Restart(ctx, &out); err != nil {
		return nil, status.Errorf(codes.Internal, "restart kubelet: %v: %s", err, strings.TrimSpace(out.String()))
	}
	if err := s.waitHealthy(ctx); err != nil {
		return nil, status.Errorf(codes.Unavailable, "kubelet restarted without its serving certificate: %v; see 'orrery logs NODE kubelet'", err)
	}
	s.c.Log.Info("kubelet restarted to ask for a new serving certificate", "removed", len(old))
	return &kubeupgradepb.RenewKubeletServingCertificateResponse{}, nil
}

// exclusive refuses a change while an upgrade or another change runs on
// the node; done ends the change.
func (s *Server) exclusive(what string) (done func(), err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.busyLocked(); err != nil {
		return nil, err
	}
	s.changing = what
	return func() {
		s.mu.Lock()
		defer s.mu.Unlock()
		s.changing = ""
	}, nil
}

// busyLocked says, as Unavailable, what runs on the node: an upgrade or
// another change. The caller holds s.mu.
func (s *Server) busyLocked() error {
	if s.job != nil && s.job.running() {
		return status.Errorf(codes.Unavailable, "this node is busy with an upgrade to Kubernetes %s (%s); ask again once it ended", s.job.version, stepName(s.job.step))
	}
	if s.changing != "" {
		return status.Errorf(codes.Unavailable, "this node is busy with %s; ask again once it ended", s.changing)
	}
	return nil
}
