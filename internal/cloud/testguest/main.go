// Command testguest is the /init of the tiny VMs the local cloud's tests
// boot (Debian's kernel + this program, no OS image). It does what a node
// does first on the cloud's network and reports each step on the serial
// console as a line "ORRERY-GUEST <key> <value>", which the test reads:
// DHCP, the metadata API, the attestation it would take, reaching its
// peers, its vTPM's AK certificate,
// and whether its state disk is blank or holds the mark of an earlier boot
// (it marks a blank one). It then waits, serving its name on port 8080, until the VM
// is reset or killed.
package main

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/google/go-tpm-tools/client"
	"github.com/orrery-dev/orrery/internal/attestation/nodeattest"
	"github.com/orrery-dev/orrery/internal/metadata"
	"github.com/u-root/u-root/pkg/dhclient"
	"github.com/u-root/u-root/pkg/kmodule"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

const metadataURL = metadata.DefaultBaseURL

func report(key, value string) { fmt.Printf("ORRERY-GUEST %s %s\n", key, value) }

func main() {
	report("boot", "ok")
	if err := run(); err != nil {
		report("error", strings.ReplaceAll(err.Error(), "\n", " "))
	}
	select {}
}

func run() error {
	for _, m := range []struct{ src, dst, typ string }{
		{"proc", "/proc", "proc"}, {"sysfs", "/sys", "sysfs"}, {"devtmpfs", "/dev", "devtmpfs"},
	} {
		os.MkdirAll(m.dst, 0o755)
		if err := unix.Mount(m.src, m.dst, m.typ, 0, ""); err != nil && err != unix.EBUSY {
			return fmt.Errorf("mount %s: %w", m.dst, err)
		}
	}
	for _, mod := range []string{"virtio_pci", "virtio_net", "virtio_blk"} {
		if err := kmodule.Probe(mod, ""); err != nil {
			return fmt.Errorf("load %s: %w", mod, err)
		}
	}
	report("tpm", tpmReport())
	report("disk", diskReport())

	if _, err := dhclient.IfUp("lo", 5*time.Second); err != nil {
		return fmt.Errorf("bring up lo: %w", err)
	}
	link, err := dhclient.IfUp("eth0", 20*time.Second)
	if err != nil {
		return fmt.Errorf("bring up eth0: %w", err)
	}
	os.MkdirAll("/etc", 0o755)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var leased bool
	for r := range dhclient.SendRequests(ctx, []netlink.Link{link}, true, false, dhclient.Config{Timeout: 5 * time.Second, Retries: 10}, 20*time.Second) {
		if r.Err != nil {
			return fmt.Errorf("dhcp: %w", r.Err)
		}
		if err := r.Lease.Configure(); err != nil {
			return fmt.Errorf("configure dhcp lease: %w", err)
		}
		leased = true
	}
	if !leased {
		return fmt.Errorf("dhcp: no lease")
	}
	addrs, _ := net.InterfaceByName("eth0")
	report("ip", ifaceIP(addrs))

	var self struct{ Name, Role, IP string }
	if err := getJSON(ctx, metadataURL+"/self", &self); err != nil {
		return err
	}
	report("self", fmt.Sprintf("%s %s %s", self.Name, self.Role, self.IP))
	report("attest", attestReport(ctx))
	var peers []struct{ Name, Role, IP string }
	if err := getJSON(ctx, metadataURL+"/peers", &peers); err != nil {
		return err
	}
	var names []string
	for _, p := range peers {
		names = append(names, p.Name)
	}
	report("peers", strings.Join(names, ","))

	go http.ListenAndServe(":8080", http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		io.WriteString(w, self.Name)
	}))
	for _, p := range peers {
		if p.Name == self.Name {
			continue
		}
		name, err := reach(ctx, p.IP)
		if err != nil {
			return fmt.Errorf("reach %s: %w", p.Name, err)
		}
		report("reached", name)
	}
	report("ready", self.Name)
	return nil
}

// diskMark starts the first sector of a state disk this guest marked.
const diskMark = "ORRERY-TEST-DISK "

// diskReport is "new ID" after marking a blank state disk with a new ID,
// "kept ID" for a disk marked before, "none" without a state disk.
func diskReport() string {
	dev, err := stateDisk()
	if err != nil {
		return "none: " + err.Error()
	}
	f, err := os.OpenFile(dev, os.O_RDWR|os.O_SYNC, 0)
	if err != nil {
		return "none: " + err.Error()
	}
	defer f.Close()
	sector := make([]byte, 512)
	if _, err := io.ReadFull(f, sector); err != nil {
		return "none: " + err.Error()
	}
	if id, ok := strings.CutPrefix(string(sector), diskMark); ok {
		return "kept " + id[:16]
	}
	var raw [8]byte
	if _, err := rand.Read(raw[:]); err != nil {
		return "none: " + err.Error()
	}
	id := hex.EncodeToString(raw[:])
	if _, err := f.WriteAt([]byte(diskMark+id), 0); err != nil {
		return "none: " + err.Error()
	}
	return "new " + id
}

// stateDisk finds the disk QEMU gave the serial "state" (vm's state
// disk); the device node appears a moment after the driver loads.
func stateDisk() (string, error) {
	for range 50 {
		blocks, _ := os.ReadDir("/sys/block")
		for _, b := range blocks {
			serial, err := os.ReadFile("/sys/block/" + b.Name() + "/serial")
			if err == nil && strings.TrimSpace(string(serial)) == "state" {
				if _, err := os.Stat("/dev/" + b.Name()); err == nil {
					return "/dev/" + b.Name(), nil
				}
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
	return "", fmt.Errorf("no disk with serial \"state\"")
}

// attestReport is what a node's own platform detection makes of this VM:
// the real kernel's view, the real metadata service, this VM's command
// line (which names no image flavour, as a cloud image's does not).
func attestReport(ctx context.Context) string {
	p, err := nodeattest.Detect(ctx, &metadata.Client{BaseURL: metadataURL})
	if err != nil {
		return "error: " + err.Error()
	}
	if p.Simulated {
		return p.Variant.String() + " simulated"
	}
	return p.Variant.String()
}

func tpmReport() string {
	rw, err := os.OpenFile("/dev/tpmrm0", os.O_RDWR, 0)
	if err != nil {
		return "none: " + err.Error()
	}
	defer rw.Close()
	ak, err := client.GceAttestationKeyECC(rw)
	if err != nil {
		return "no-ak: " + err.Error()
	}
	defer ak.Close()
	if ak.Cert() == nil {
		return "no-ak-cert"
	}
	return "akcert:" + base64.StdEncoding.EncodeToString(ak.CertDERBytes())
}

func ifaceIP(i *net.Interface) string {
	if i == nil {
		return "none"
	}
	addrs, _ := i.Addrs()
	for _, a := range addrs {
		if n, ok := a.(*net.IPNet); ok && n.IP.To4() != nil {
			return n.IP.String()
		}
	}
	return "none"
}

func getJSON(ctx context.Context, url string, v any) error {
	var last error
	for ctx.Err() == nil {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		resp, err := http.DefaultClient.Do(req)
		if err == nil {
			body, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return json.Unmarshal(body, v)
			}
			return fmt.Errorf("GET %s: %s: %s", url, resp.Status, body)
		}
		last = err
		time.Sleep(500 * time.Millisecond)
	}
	return fmt.Errorf("GET %s: %v", url, last)
}

func reach(ctx context.Context, ip string) (string, error) {
	var last error
	for ctx.Err() == nil {
		c := http.Client{Timeout: 2 * time.Second}
		resp, err := c.Get("http://" + net.JoinHostPort(ip, "8080"))
		if err == nil {
			b, _ := io.ReadAll(io.LimitReader(resp.Body, 256))
			resp.Body.Close()
			return string(b), nil
		}
		last = err
		time.Sleep(500 * time.Millisecond)
	}
	return "", last
}
