package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"time"

	"google.golang.org/grpc"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/orrery-dev/orrery/bootstrapperd/internal/kubeadm"
	"github.com/orrery-dev/orrery/bootstrapperd/internal/kuberelease"
	"github.com/orrery-dev/orrery/bootstrapperd/internal/upgradeserver"
	"github.com/orrery-dev/orrery/internal/etcd"
	"github.com/orrery-dev/orrery/internal/logging"
	"github.com/orrery-dev/orrery/internal/ownerservice"
	"github.com/orrery-dev/orrery/internal/proto/kubeupgradepb"
	"github.com/orrery-dev/orrery/internal/tpm/pcrlog"
)

// kubeletWait is how long a switched kubelet may take to answer its
// health check. Under TCG on a busy host a kubelet start took up to a
// minute (its first sync of every pod); five leave room, and a kubelet
// that never comes up costs the owner that wait before the node goes
// back to its release.
const kubeletWait = 5 * time.Minute

// staticPodWait is how long a control plane's rewritten API server and
// controller manager may take to run again: kubeadm waits as long for a
// component it replaces in an upgrade (its upgradeManifests timeout is
// 15 min); under TCG an API server took one to two minutes to be Ready.
const staticPodWait = 15 * time.Minute

// serveUpgrades serves the owner's Kubernetes upgrades of this node
// ('bootstrapperd serve-upgrades', from orrery-kubernetes-upgrade.socket):
// as root, since it runs kubeadm and restarts kubelet, and only to a
// client that proves the owner's access key.
func serveUpgrades(ctx context.Context, args []string) error {
	p := nodePaths()
	fs := flag.NewFlagSet("bootstrapperd serve-upgrades", flag.ExitOnError)
	listen := fs.String("listen", "", "listen on this address instead of the socket systemd passes (e.g. :9002)")
	firmwareLog := fs.String("firmware-event-log", p.firmwareLog, "the firmware's TCG event log")
	var level logging.Level
	logging.AddLevelFlag(fs, &level)
	_ = fs.Parse(args)
	log := logging.New(logging.Config{Program: "bootstrapperd-upgrades", Format: logging.Journal, Level: level, Output: os.Stderr})
	runner := kubeadm.ExecRunner{}
	srv := upgradeserver.New(upgradeserver.Config{
		Release:        kuberelease.Node{Root: p.root},
		Kubeadm:        &kubeadm.Tool{Runner: runner, ConfigDir: filepath.Join(p.runDir, "upgrade"), AdminKubeconfig: p.adminKubeconfig},
		Manifests:      manifestsDir,
		KubeletConfig:  "/etc/kubernetes/kubelet.conf",
		KubeadmBackups: "/etc/kubernetes/tmp",
		Kubelet:        systemdKubelet{runner: runner},
		Etcd:           etcd.Kubeadm,
		KubeletWait:    kubeletWait,
		PKIDir:         kubeadm.CertificatesDir,
		KubeletPKI:     "/var/lib/kubelet/pki",
		Cluster: func() (kubernetes.Interface, error) {
			rc, err := clientcmd.BuildConfigFromFlags("", p.adminKubeconfig)
			if err != nil {
				return nil, err
			}
			return kubernetes.NewForConfig(rc)
		},
		PodWait: staticPodWait,
		Log:     log,
	})
	err := ownerservice.Serve(ctx, ownerservice.Config{
		Listen: *listen, Socket: "orrery-kubernetes-upgrade.socket", OwnerKey: p.ownerKey,
		MeasurementLog: &pcrlog.Log{Path: p.measurementLog}, FirmwareLog: *firmwareLog, MetadataURL: p.metadataURL,
		// A client sends small requests only.
		MaxRecvMsgSize: 16 << 10,
		// Stopping the service cuts a follower's stream, not the upgrade:
		// the service waits for it below, as long as systemd lets it
		// (TimeoutStopSec).
		StopWait: 5 * time.Second,
		Log:      log,
	}, func(s *grpc.Server) { kubeupgradepb.RegisterKubernetesUpgradeServiceServer(s, srv) })
	if v, busy := srv.Busy(); busy {
		log.Info("waiting for the upgrade under way to end before stopping", "to", v)
	}
	srv.Wait()
	return err
}

// systemdKubelet is kubelet.service.
type systemdKubelet struct{ runner kubeadm.Runner }

func (k systemdKubelet) Restart(ctx context.Context, out io.Writer) error {
	return k.runner.Run(ctx, "systemctl", []string{"restart", "kubelet.service"}, nil, out)
}

// kubeletHealthz is kubelet's health check, on loopback (kubelet's
// healthzBindAddress default).
const kubeletHealthz = "http://127.0.0.1:10248/healthz"

func (systemdKubelet) Healthy(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, kubeletHealthz, nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("kubelet's health check answered %s", resp.Status)
	}
	return nil
}
