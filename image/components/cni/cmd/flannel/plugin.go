package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/containernetworking/cni/pkg/invoke"
	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"
)

const (
	defaultSubnetFile = "/run/flannel/subnet.env"
	defaultDataDir    = "/var/lib/cni/flannel"
)

// netConf is the plugin's network configuration. Zero values mean the
// defaults above; Delegate entries override the generated delegate
// configuration key by key.
type netConf struct {
	types.NetConf
	SubnetFile string         `json:"subnetFile"`
	DataDir    string         `json:"dataDir"`
	Delegate   map[string]any `json:"delegate"`
}

// subnetEnv is what flanneld wrote to the subnet file.
type subnetEnv struct {
	network *net.IPNet // the whole cluster's pod network
	subnet  *net.IPNet // this node's share of it
	mtu     int
	ipMasq  bool // flanneld masquerades traffic leaving the pod network itself
}

func loadConf(data []byte) (*netConf, error) {
	c := &netConf{SubnetFile: defaultSubnetFile, DataDir: defaultDataDir}
	if err := json.Unmarshal(data, c); err != nil {
		return nil, fmt.Errorf("parse network configuration: %w", err)
	}
	return c, nil
}

func readSubnetEnv(path string) (subnetEnv, error) {
	f, err := os.Open(path)
	if err != nil {
		return subnetEnv{}, fmt.Errorf("open flannel subnet file (is flanneld running on this node?): %w", err)
	}
	defer f.Close()
	var env subnetEnv
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		key, val, ok := strings.Cut(strings.TrimSpace(sc.Text()), "=")
		if !ok {
			continue
		}
		switch key {
		case "FLANNEL_NETWORK":
			_, env.network, err = net.ParseCIDR(val)
		case "FLANNEL_SUBNET":
			// flanneld writes the gateway address (10.244.1.1/24);
			// host-local wants the network (10.244.1.0/24) and takes
			// its first address as the gateway.
			_, env.subnet, err = net.ParseCIDR(val)
		case "FLANNEL_MTU":
			env.mtu, err = strconv.Atoi(val)
		case "FLANNEL_IPMASQ":
			env.ipMasq, err = strconv.ParseBool(val)
		}
		if err != nil {
			return subnetEnv{}, fmt.Errorf("%s: %s: %w", path, key, err)
		}
	}
	if err := sc.Err(); err != nil {
		return subnetEnv{}, fmt.Errorf("read %s: %w", path, err)
	}
	if env.network == nil || env.subnet == nil {
		return subnetEnv{}, fmt.Errorf("%s: FLANNEL_NETWORK or FLANNEL_SUBNET missing", path)
	}
	return env, nil
}

// delegateConf builds the delegate's configuration from the subnet file and
// the user's overrides.
func delegateConf(c *netConf, env subnetEnv) ([]byte, string, error) {
	d := map[string]any{
		"type":        "bridge",
		"isGateway":   true,
		"hairpinMode": true,
		"ipMasq":      !env.ipMasq,
	}
	for k, v := range c.Delegate {
		d[k] = v
	}
	d["name"] = c.Name
	d["cniVersion"] = c.CNIVersion
	if env.mtu > 0 {
		if _, ok := d["mtu"]; !ok {
			d["mtu"] = env.mtu
		}
	}
	if _, ok := d["ipam"]; !ok {
		d["ipam"] = map[string]any{
			"type":   "host-local",
			"ranges": [][]map[string]string{{{"subnet": env.subnet.String()}}},
			"routes": []map[string]string{{"dst": env.network.String()}},
		}
	}
	typ, _ := d["type"].(string)
	if typ == "" {
		return nil, "", errors.New(`delegate "type" must be a plugin name`)
	}
	data, err := json.Marshal(d)
	return data, typ, err
}

func savedPath(c *netConf, containerID string) (string, error) {
	if containerID == "" || strings.ContainsAny(containerID, `/\`) || containerID == "." || containerID == ".." {
		return "", fmt.Errorf("invalid container ID %q", containerID)
	}
	return filepath.Join(c.DataDir, containerID), nil
}

func cmdAdd(args *skel.CmdArgs) error {
	c, err := loadConf(args.StdinData)
	if err != nil {
		return err
	}
	env, err := readSubnetEnv(c.SubnetFile)
	if err != nil {
		return err
	}
	conf, typ, err := delegateConf(c, env)
	if err != nil {
		return err
	}
	p, err := savedPath(c, args.ContainerID)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(c.DataDir, 0o700); err != nil {
		return fmt.Errorf("create %s: %w", c.DataDir, err)
	}
	if err := os.WriteFile(p, conf, 0o600); err != nil {
		return fmt.Errorf("save delegate configuration: %w", err)
	}
	res, err := invoke.DelegateAdd(context.Background(), typ, conf, nil)
	if err != nil {
		return fmt.Errorf("delegate %s: %w", typ, err)
	}
	return types.PrintResult(res, c.CNIVersion)
}

// saved returns the delegate configuration ADD saved, or nil if there is none.
func saved(args *skel.CmdArgs) ([]byte, string, error) {
	c, err := loadConf(args.StdinData)
	if err != nil {
		return nil, "", err
	}
	p, err := savedPath(c, args.ContainerID)
	if err != nil {
		return nil, "", err
	}
	conf, err := os.ReadFile(p)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, p, nil
	}
	if err != nil {
		return nil, "", fmt.Errorf("read saved delegate configuration: %w", err)
	}
	return conf, p, nil
}

func delegateType(conf []byte) (string, error) {
	var t struct {
		Type string `json:"type"`
	}
	if err := json.Unmarshal(conf, &t); err != nil || t.Type == "" {
		return "", fmt.Errorf("saved delegate configuration has no type: %v", err)
	}
	return t.Type, nil
}

func cmdDel(args *skel.CmdArgs) error {
	conf, p, err := saved(args)
	if err != nil {
		return err
	}
	if conf == nil {
		return nil // never added, or already deleted: DEL must succeed
	}
	typ, err := delegateType(conf)
	if err != nil {
		return err
	}
	if err := invoke.DelegateDel(context.Background(), typ, conf, nil); err != nil {
		return fmt.Errorf("delegate %s: %w", typ, err)
	}
	if err := os.Remove(p); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("remove saved delegate configuration: %w", err)
	}
	return nil
}

func cmdCheck(args *skel.CmdArgs) error {
	conf, _, err := saved(args)
	if err != nil {
		return err
	}
	if conf == nil {
		return fmt.Errorf("no saved delegate configuration for container %s", args.ContainerID)
	}
	typ, err := delegateType(conf)
	if err != nil {
		return err
	}
	// CHECK hands the delegate the result of ADD, which the runtime passes
	// in as prevResult.
	c, err := loadConf(args.StdinData)
	if err != nil {
		return err
	}
	var d map[string]any
	if err := json.Unmarshal(conf, &d); err != nil {
		return fmt.Errorf("parse saved delegate configuration: %w", err)
	}
	if c.RawPrevResult != nil {
		d["prevResult"] = c.RawPrevResult
	}
	if conf, err = json.Marshal(d); err != nil {
		return err
	}
	return invoke.DelegateCheck(context.Background(), typ, conf, nil)
}
