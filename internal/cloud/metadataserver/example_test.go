package metadataserver_test

import (
	"context"
	"fmt"
	"log"
	"net/http"
	"net/http/httptest"
	"net/netip"

	"golang.org/x/crypto/bcrypt"

	"github.com/orrery-dev/orrery/internal/cloud/metadataserver"
	"github.com/orrery-dev/orrery/internal/metadata"
	"github.com/orrery-dev/orrery/internal/role"
)

func Example() {
	hash, err := bcrypt.GenerateFromPassword([]byte("init secret"), bcrypt.MinCost)
	if err != nil {
		log.Fatal(err)
	}
	h, err := metadataserver.NewHandler(metadataserver.Config{
		Instances: []metadata.Instance{
			{Name: "cp-0", Role: role.ControlPlane, IP: netip.MustParseAddr("10.42.0.10")},
			{Name: "worker-0", Role: role.Worker, IP: netip.MustParseAddr("10.42.0.11")},
		},
		InitSecretHash: hash,
	})
	if err != nil {
		log.Fatal(err)
	}
	// The harness serves h on the bridge's metadata address. Here a test
	// server on loopback stands in, and every request looks as if it came
	// from worker-0.
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		r.RemoteAddr = "10.42.0.11:40000"
		h.ServeHTTP(w, r)
	}))
	defer srv.Close()

	// On a node: c := metadata.Client{BaseURL: "http://169.254.169.254"}.
	c := metadata.Client{BaseURL: srv.URL}
	ctx := context.Background()
	self, err := c.Self(ctx)
	if err != nil {
		log.Fatal(err)
	}
	ep, err := c.Endpoint(ctx)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(self.Name, self.Role, ep)
	// Output: worker-0 worker 10.42.0.10:6443
}
