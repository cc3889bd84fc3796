package main

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/orrery-dev/orrery/internal/proto/keypb"
	"github.com/orrery-dev/orrery/joinservice/internal/keyservice"
)

// The key service's transport takes no request larger than a valid one
// can be.
func TestKeyServiceRefusesOversizedRequests(t *testing.T) {
	base, err := os.MkdirTemp("", "keyservice-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(base) })
	socket := filepath.Join(base, "keyservice", "keys.sock")
	startKeys(t, socket)
	kc, err := dialKeys(socket)
	if err != nil {
		t.Fatal(err)
	}
	defer kc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	tests := map[string]struct {
		size     int
		wantCode codes.Code
	}{
		"at the transport limit": {keyservice.MaxRequestSize, codes.InvalidArgument},
		"one byte over":          {keyservice.MaxRequestSize + 1, codes.ResourceExhausted},
		"1 MiB":                  {1 << 20, codes.ResourceExhausted},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			req := &keypb.GetDataKeyRequest{Length: 32}
			for range 4 { // the ID's length prefix changes with it
				if d := tc.size - proto.Size(req); d >= 0 {
					req.DataKeyId += strings.Repeat("k", d)
				} else {
					req.DataKeyId = req.DataKeyId[:len(req.DataKeyId)+d]
				}
			}
			_, err := kc.c.GetDataKey(ctx, req)
			if st := status.Convert(err); st.Code() != tc.wantCode || len(st.Message()) > 200 {
				t.Fatalf("a %d-byte request: %v %.200q, want %v and a short error", proto.Size(req), st.Code(), st.Message(), tc.wantCode)
			}
		})
	}
}
