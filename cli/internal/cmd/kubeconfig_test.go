package cmd

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"github.com/orrery-dev/orrery/internal/owner/workspace"
)

// writeKubeconfig writes a kubeconfig with one context per server name.
func writeKubeconfig(t *testing.T, path, current string, servers ...string) {
	t.Helper()
	c := clientcmdapi.NewConfig()
	for _, s := range servers {
		c.Clusters[s] = &clientcmdapi.Cluster{Server: "https://" + s + ":6443"}
		c.AuthInfos[s] = &clientcmdapi.AuthInfo{Token: "token-" + s}
		c.Contexts[s] = &clientcmdapi.Context{Cluster: s, AuthInfo: s}
	}
	c.CurrentContext = current
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := clientcmd.WriteToFile(*c, path); err != nil {
		t.Fatal(err)
	}
}

func serverOf(t *testing.T, o kubeconfigOptions, ws workspace.Dir) string {
	t.Helper()
	rc, err := o.restConfig(ws)
	if err != nil {
		t.Fatal(err)
	}
	return rc.Host
}

// The cluster is chosen as kubectl chooses it, with the workspace's admin
// kubeconfig before ~/.kube/config.
func TestKubeconfigChoice(t *testing.T) {
	home := t.TempDir()
	t.Setenv("HOME", home)
	t.Setenv("KUBECONFIG", "")
	ws := workspace.Dir(t.TempDir())
	writeKubeconfig(t, filepath.Join(home, ".kube", "config"), "home", "home")
	if got := serverOf(t, kubeconfigOptions{}, ws); got != "https://home:6443" {
		t.Errorf("no workspace kubeconfig: %s; want ~/.kube/config's", got)
	}
	writeKubeconfig(t, ws.Path(workspace.KubeconfigFile), "admin", "admin")
	if got := serverOf(t, kubeconfigOptions{}, ws); got != "https://admin:6443" {
		t.Errorf("with the workspace's kubeconfig: %s; want it", got)
	}
	two := filepath.Join(t.TempDir(), "two")
	writeKubeconfig(t, two, "a", "a", "b")
	t.Setenv("KUBECONFIG", two)
	if got := serverOf(t, kubeconfigOptions{}, ws); got != "https://a:6443" {
		t.Errorf("KUBECONFIG: %s; want its current context", got)
	}
	if got := serverOf(t, kubeconfigOptions{context: "b"}, ws); got != "https://b:6443" {
		t.Errorf("--context b: %s", got)
	}
	extra := filepath.Join(t.TempDir(), "extra")
	writeKubeconfig(t, extra, "", "c")
	t.Setenv("KUBECONFIG", two+string(os.PathListSeparator)+extra)
	if got := serverOf(t, kubeconfigOptions{context: "c"}, ws); got != "https://c:6443" {
		t.Errorf("--context c from the second KUBECONFIG file: %s", got)
	}
	if got := serverOf(t, kubeconfigOptions{path: ws.Path(workspace.KubeconfigFile)}, ws); got != "https://admin:6443" {
		t.Errorf("--kubeconfig: %s", got)
	}
	if _, err := (kubeconfigOptions{context: "nope"}).restConfig(ws); err == nil || !strings.Contains(err.Error(), "it has a, b, c") {
		t.Errorf("unknown context: %v; want the contexts listed", err)
	}
	if _, err := (kubeconfigOptions{path: filepath.Join(home, "missing")}).restConfig(ws); err == nil || !strings.Contains(err.Error(), "no kubeconfig at") {
		t.Errorf("missing file: %v", err)
	}
	if entries, _ := filepath.Glob(filepath.Join(os.TempDir(), "orrery-kubeconfig-*")); len(entries) > 0 {
		t.Errorf("temporary kubeconfigs left behind: %v", entries)
	}
}

func TestMergeKubeconfig(t *testing.T) {
	home := t.TempDir()
	t.Setenv("HOME", home)
	t.Setenv("KUBECONFIG", "")
	user := filepath.Join(home, ".kube", "config")
	writeKubeconfig(t, user, "work", "work")
	admin := filepath.Join(t.TempDir(), workspace.KubeconfigFile)
	writeKubeconfig(t, admin, "kubernetes-admin@demo", "kubernetes-admin@demo")
	name, path, err := mergeKubeconfig(admin, "orrery-demo")
	if err != nil || name != "orrery-demo" || path != user {
		t.Fatalf("merge: %q %q %v", name, path, err)
	}
	c, err := clientcmd.LoadFromFile(user)
	if err != nil {
		t.Fatal(err)
	}
	if c.CurrentContext != "orrery-demo" || c.Contexts["work"] == nil || c.Clusters["orrery-demo"].Server != "https://kubernetes-admin@demo:6443" {
		t.Fatalf("merged kubeconfig: current %q, contexts %v", c.CurrentContext, contextNames(c))
	}
	if st, err := os.Stat(user); err != nil || st.Mode().Perm() != 0o600 {
		t.Errorf("%s: %v, %v; want 0600", user, st, err)
	}
}
