package inspectserver

import (
	"bufio"
	"bytes"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/orrery-dev/orrery/internal/proto/inspectpb"
)

// Host reads what Status reports from the node's files.
type Host struct {
	// Root is prepended to every path read (tests); empty is "/".
	Root string
	// Stage is where the node stands: "system", or "initrd".
	Stage string
	// ClusterID returns the ID the node is locked to, nil if it is not.
	ClusterID func() ([]byte, error)
}

func (h Host) read(p string) string {
	b, err := os.ReadFile(filepath.Join(h.Root, p))
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(b))
}

// Status reads the node's status; a file it cannot read leaves its field
// empty rather than failing the whole answer.
func (h Host) Status() *inspectpb.StatusResponse {
	st := &inspectpb.StatusResponse{Stage: h.Stage}
	st.NodeName = h.read("/proc/sys/kernel/hostname")
	st.Image = imageName(h.read("/usr/lib/os-release"))
	st.BootId = h.read("/proc/sys/kernel/random/boot_id")
	if f := strings.Fields(h.read("/proc/uptime")); len(f) > 0 {
		if up, err := strconv.ParseFloat(f[0], 64); err == nil {
			st.UptimeSeconds = int64(up)
		}
	}
	if h.ClusterID != nil {
		if id, err := h.ClusterID(); err == nil {
			st.ClusterId = id
		}
	}
	return st
}

// imageName is os-release's PRETTY_NAME with IMAGE_VERSION, if any.
func imageName(osRelease string) string {
	kv := map[string]string{}
	sc := bufio.NewScanner(bytes.NewBufferString(osRelease))
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), "=")
		if !ok {
			continue
		}
		if u, err := strconv.Unquote(v); err == nil {
			v = u
		}
		kv[k] = v
	}
	name := kv["PRETTY_NAME"]
	if name == "" {
		name = kv["NAME"]
	}
	for _, k := range []string{"IMAGE_VERSION", "VARIANT_ID"} {
		if v := kv[k]; v != "" && !strings.Contains(name, v) {
			name += " " + v
		}
	}
	return name
}
