package diskgen

import (
	"context"
	"crypto/rand"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/orrery-dev/orrery/internal/attestation"
	"github.com/orrery-dev/orrery/internal/attestation/measurements"
	"github.com/orrery-dev/orrery/internal/attestation/qemu/platformca"
	"github.com/orrery-dev/orrery/internal/attestation/qemu/qemutest"
	"github.com/orrery-dev/orrery/internal/joinconn"
	"github.com/orrery-dev/orrery/internal/keys"
	"github.com/orrery-dev/orrery/internal/testkit/syncbuffer"
	"github.com/orrery-dev/orrery/joinservice/joinservicetest"
)

// The real join server and the node's own dialer, over attested TLS on
// software TPMs: rejoins advance the disk's generation, an older copy of
// the disk is refused with what to do, and a join service of another
// cluster of the same image (which would accept any generation: its
// record is its own) is never asked.
func TestThroughTheJoinService(t *testing.T) {
	own, node := dialOwnCluster(t)
	path := filepath.Join(t.TempDir(), "var/lib/orrery/disk-generation")
	var console syncbuffer.Buffer
	check := func(first string) error {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		c := &Checker{JoinService: own, DiskUUID: uuid, Path: path, First: first, Retry: time.Millisecond, MaxRetry: time.Millisecond,
			Say: func(format string, args ...any) {
				fmt.Fprintf(&console, format+"\n", args...)
				if strings.Contains(fmt.Sprintf(format, args...), "not recorded yet") {
					cancel() // one failed round is enough to see
				}
			}}
		return c.Run(ctx)
	}

	for want := uint64(1); want <= 2; want++ {
		if err := check(cp0); err != nil {
			t.Fatalf("rejoin %d: %v", want, err)
		}
		if got, err := Read(path); got != want || err != nil {
			t.Fatalf("after rejoin %d the disk holds %d, %v", want, got, err)
		}
	}
	// The host swaps in the copy it took before the second rejoin.
	if err := Write(path, 1); err != nil {
		t.Fatal(err)
	}
	err := check(cp0)
	var older *OlderDiskError
	if !errors.As(err, &older) {
		t.Fatalf("an older copy: err = %v, want an OlderDiskError", err)
	}
	for _, want := range []string{"presents generation 1 but the cluster recorded 2: it is an older copy of the disk", "orrery node remove " + node.Name, `"generation":1`} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("%v\ndoes not say %q", err, want)
		}
	}
	if got, _ := Read(path); got != 1 {
		t.Errorf("the refused copy holds %d, want 1, untouched", got)
	}

	// Another cluster's join service, of the same image: the node does
	// not believe it.
	if err := check(cp1); !errors.Is(err, context.Canceled) {
		t.Fatalf("asking another cluster's join service: err = %v, want it never to answer", err)
	}
	if want := "PCR 15 locked to this node's own cluster"; !strings.Contains(console.String(), want) {
		t.Errorf("console does not say %q:\n%s", want, console.String())
	}
	if got, _ := Read(path); got != 1 {
		t.Errorf("the disk holds %d after another cluster's join service was asked, want 1", got)
	}
}

// dialOwnCluster serves the join services of cp-0, of "this cluster", and
// cp-1, of "another cluster" of the same image, on software TPMs, and
// returns a node's dialer to the join services of its own cluster, "this
// cluster", and the node's instance.
func dialOwnCluster(t *testing.T) (*joinconn.Dialer, attestation.Instance) {
	t.Helper()
	ca, err := platformca.New("test platform CA")
	if err != nil {
		t.Fatal(err)
	}
	node := qemutest.NewNodeOf(t, ca).Boot(t, "image-1", "image-1")
	pcrs := node.PCRs(t)
	nodes := measurements.M{15: {Expected: make([]byte, 32)}}
	for _, pcr := range joinconn.ImagePCRs {
		nodes[pcr] = measurements.Measurement{Expected: pcrs[pcr]}
	}
	serve := func(name, cluster string) string {
		ms, err := keys.GenerateMasterSecret(rand.Reader)
		if err != nil {
			t.Fatal(err)
		}
		cp := qemutest.NewInstance(t, ca, platformca.NewInstance(name)).Boot(t, "image-1", "image-1").Lock(t, cluster)
		return joinservicetest.Serve(t, joinservicetest.Config{
			Identity: cp.Issuer, PlatformCA: ca.Cert, Measurements: nodes, MasterSecret: ms,
			Admitted: map[string]attestation.Instance{uuid: node.Instance},
		})
	}
	routes := map[string]string{cp0: serve("cp-0", "this cluster"), cp1: serve("cp-1", "another cluster")}
	d, err := joinconn.New(joinconn.Config{
		Issuer: node.Issuer, OpenTPM: node.TPM.Open, PlatformCAs: []*x509.Certificate{ca.Cert},
		Cmdline: func() ([]byte, error) { return []byte("console=ttyS0"), nil },
		DialNet: func(ctx context.Context, addr string) (net.Conn, error) {
			var nd net.Dialer
			return nd.DialContext(ctx, "tcp", routes[addr])
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	own, err := d.OfCluster([]byte("this cluster"))
	if err != nil {
		t.Fatal(err)
	}
	return own, node.Instance
}
