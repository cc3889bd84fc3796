package cmd

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"k8s.io/client-go/util/homedir"

	"github.com/orrery-dev/orrery/internal/owner/upgrade"
	"github.com/orrery-dev/orrery/internal/owner/workspace"
)

// workspaceDir is the owner's workspace (--workspace): where init writes
// the master secret, state and admin kubeconfig, and where the other
// commands look for them.
func workspaceDir(cmd *cobra.Command) workspace.Dir {
	if f := cmd.Flag("workspace"); f != nil && f.Value.String() != "" {
		return workspace.Dir(f.Value.String())
	}
	return "."
}

// kubeconfigOptions choose the cluster the way kubectl does.
type kubeconfigOptions struct {
	path    string
	context string
}

func addKubeconfigFlags(f *pflag.FlagSet, o *kubeconfigOptions) {
	f.StringVar(&o.path, "kubeconfig", "", "the cluster's kubeconfig (default: $KUBECONFIG, else "+workspace.KubeconfigFile+" in the workspace, else ~/.kube/config)")
	f.StringVar(&o.context, "context", "", "the kubeconfig context to use (default: its current context)")
}

// loadingRules are kubectl's rules for the kubeconfig to read:
// --kubeconfig, $KUBECONFIG, then the workspace's admin kubeconfig (where
// 'orrery init' wrote it), then ~/.kube/config. single is the one file
// they name, or "" for several files in $KUBECONFIG.
func (o kubeconfigOptions) loadingRules(ws workspace.Dir) (rules *clientcmd.ClientConfigLoadingRules, single string, err error) {
	rules = clientcmd.NewDefaultClientConfigLoadingRules()
	switch {
	case o.path != "":
		single = o.path
	case os.Getenv(clientcmd.RecommendedConfigPathEnvVar) != "":
		if files := filepath.SplitList(os.Getenv(clientcmd.RecommendedConfigPathEnvVar)); len(files) == 1 {
			single = files[0]
		}
	case exists(ws.Path(workspace.KubeconfigFile)):
		single = ws.Path(workspace.KubeconfigFile)
		if err := checkWorkspaceKubeconfig(ws); err != nil {
			return nil, "", err
		}
	default:
		single = homeKubeconfig()
	}
	if single == "" {
		return rules, "", nil
	}
	if !exists(single) {
		return nil, "", fmt.Errorf("no kubeconfig at %s: pass --kubeconfig, set KUBECONFIG, or run in the workspace where 'orrery init' wrote %s (--workspace DIR)", single, workspace.KubeconfigFile)
	}
	rules.ExplicitPath = single
	return rules, single, nil
}

// checkWorkspaceKubeconfig checks the admin kubeconfig the command found
// in the workspace, unnamed: a plain file whose users authenticate with
// what the file holds. The workspace is often a checkout or a shared
// directory, and a kubeconfig planted there would otherwise run a command
// of its choosing on the owner's machine (an exec credential plugin, which
// client-go runs), or be a link to a file elsewhere. Orrery's admin
// kubeconfig holds a client certificate; a kubeconfig the owner names
// (--kubeconfig, $KUBECONFIG) is the owner's choice and is not checked.
func checkWorkspaceKubeconfig(ws workspace.Dir) error {
	if err := ws.CheckRegular(workspace.KubeconfigFile); err != nil {
		return err
	}
	path := ws.Path(workspace.KubeconfigFile)
	cfg, err := clientcmd.LoadFromFile(path)
	if err != nil {
		return fmt.Errorf("load kubeconfig %s: %w", path, err)
	}
	for name, u := range cfg.AuthInfos {
		if u.Exec != nil || u.AuthProvider != nil {
			return fmt.Errorf("%s, found in the workspace, has user %q that runs a command or a plugin for its credentials; 'orrery init' writes none, and a kubeconfig planted in the workspace could run anything as you: "+
				"delete it, or name a kubeconfig you trust with --kubeconfig", path, name)
		}
	}
	return nil
}

// load reads the kubeconfig the rules name with the chosen context made
// current, and checks that the context exists.
func (o kubeconfigOptions) load(rules *clientcmd.ClientConfigLoadingRules) (*clientcmdapi.Config, error) {
	raw, err := rules.Load()
	if err != nil {
		return nil, fmt.Errorf("load kubeconfig: %w", err)
	}
	if o.context != "" {
		if _, ok := raw.Contexts[o.context]; !ok {
			return nil, fmt.Errorf("--context %q: the kubeconfig has no such context; it has %s", o.context, contextNames(raw))
		}
		raw.CurrentContext = o.context
	}
	return raw, nil
}

// connect connects to the cluster of the kubeconfig the options name, as
// 'status' and 'upgrade' read and change it; cleanup removes what
// resolve wrote.
func (o kubeconfigOptions) connect(ctx context.Context, ws workspace.Dir) (cluster *upgrade.Cluster, cleanup func(), err error) {
	kubeconfig, cleanup, err := o.resolve(ws)
	if err != nil {
		return nil, nil, err
	}
	if cluster, err = upgrade.Connect(ctx, kubeconfig); err != nil {
		cleanup()
		return nil, nil, err
	}
	return cluster, cleanup, nil
}

// resolve returns the path of a kubeconfig file whose current context is
// the cluster chosen (see loadingRules). When a context is chosen, or
// $KUBECONFIG lists several files, it writes that context alone to a
// private temporary file, which cleanup removes: Helm and the owner's
// libraries take one file.
func (o kubeconfigOptions) resolve(ws workspace.Dir) (path string, cleanup func(), err error) {
	rules, single, err := o.loadingRules(ws)
	if err != nil {
		return "", nil, err
	}
	if o.context == "" && single != "" {
		return single, func() {}, nil
	}
	raw, err := o.load(rules)
	if err != nil {
		return "", nil, err
	}
	if err := clientcmdapi.MinifyConfig(raw); err != nil {
		return "", nil, fmt.Errorf("kubeconfig: %w (choose a context with --context)", err)
	}
	if err := clientcmdapi.FlattenConfig(raw); err != nil {
		return "", nil, fmt.Errorf("kubeconfig: %w", err)
	}
	dir, err := os.MkdirTemp("", "orrery-kubeconfig-")
	if err != nil {
		return "", nil, err
	}
	cleanup = func() { os.RemoveAll(dir) }
	path = filepath.Join(dir, "config")
	if err := clientcmd.WriteToFile(*raw, path); err != nil {
		cleanup()
		return "", nil, err
	}
	return path, cleanup, nil
}

// mergeKubeconfig adds the current context of the kubeconfig at admin,
// with its cluster and user, to the user's kubeconfig (the first file of
// $KUBECONFIG, or ~/.kube/config) under name, and makes it the current
// context, as kind and other cluster tools do. It returns the name and
// the file it wrote.
func mergeKubeconfig(admin, name string) (string, string, error) {
	src, err := clientcmd.LoadFromFile(admin)
	if err != nil {
		return "", "", err
	}
	c, ok := src.Contexts[src.CurrentContext]
	if !ok || src.Clusters[c.Cluster] == nil || src.AuthInfos[c.AuthInfo] == nil {
		return "", "", fmt.Errorf("%s has no complete current context", admin)
	}
	target := homeKubeconfig()
	if files := filepath.SplitList(os.Getenv(clientcmd.RecommendedConfigPathEnvVar)); len(files) > 0 {
		target = files[0]
	}
	dst := clientcmdapi.NewConfig()
	if exists(target) {
		if dst, err = clientcmd.LoadFromFile(target); err != nil {
			return "", "", err
		}
	}
	dst.Clusters[name] = src.Clusters[c.Cluster]
	dst.AuthInfos[name] = src.AuthInfos[c.AuthInfo]
	dst.Contexts[name] = &clientcmdapi.Context{Cluster: name, AuthInfo: name}
	dst.CurrentContext = name
	if err := os.MkdirAll(filepath.Dir(target), 0o700); err != nil { //nolint:gosec // the owner names the kubeconfig (KUBECONFIG, ~/.kube)
		return "", "", err
	}
	return name, target, clientcmd.WriteToFile(*dst, target)
}

// restConfig is the client configuration of the cluster chosen, read in
// place: no copy of the credentials is written.
func (o kubeconfigOptions) restConfig(ws workspace.Dir) (*rest.Config, error) {
	rules, _, err := o.loadingRules(ws)
	if err != nil {
		return nil, err
	}
	raw, err := o.load(rules)
	if err != nil {
		return nil, err
	}
	rc, err := clientcmd.NewDefaultClientConfig(*raw, &clientcmd.ConfigOverrides{}).ClientConfig()
	if err != nil {
		return nil, fmt.Errorf("kubeconfig: %w (choose a context with --context)", err)
	}
	return rc, nil
}

func contextNames(c *clientcmdapi.Config) string {
	var names []string
	for n := range c.Contexts {
		names = append(names, n)
	}
	if len(names) == 0 {
		return "none"
	}
	slices.Sort(names)
	return strings.Join(names, ", ")
}

// homeKubeconfig is ~/.kube/config. clientcmd computes its own copy
// once, when the program starts; this one follows $HOME as it is now.
func homeKubeconfig() string {
	return filepath.Join(homedir.HomeDir(), clientcmd.RecommendedHomeDir, clientcmd.RecommendedFileName)
}

func exists(path string) bool {
	_, err := os.Stat(path) //nolint:gosec // the owner names the kubeconfig (KUBECONFIG, ~/.kube)
	return !errors.Is(err, os.ErrNotExist)
}
