package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"os"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/orrery-dev/orrery/internal/proto/keypb"
	"github.com/orrery-dev/orrery/joinservice/internal/keyservice"
)

// DefaultKeyServiceAddr is loopback: only the join service beside it asks.
const DefaultKeyServiceAddr = "127.0.0.1:9001"

func runKeys(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("joinservice keys", flag.ExitOnError)
	listen := fs.String("listen", DefaultKeyServiceAddr, "address to serve on; keep it on loopback")
	secretPath := fs.String("master-secret", "/var/run/orrery/master-secret/master-secret.json", "the master secret file (mounted from its Secret, mode 0400)")
	_ = fs.Parse(args)
	if host, _, err := net.SplitHostPort(*listen); err != nil || !net.ParseIP(host).IsLoopback() {
		return fmt.Errorf("--listen %s is not a loopback address: the key service must not be reachable from the network", *listen)
	}
	log := slog.New(slog.NewJSONHandler(os.Stderr, nil))
	// Fail at start if the secret is unreadable, not at the first join.
	load := keyservice.FileLoader(*secretPath)
	if _, err := load(); err != nil {
		return err
	}
	lis, err := net.Listen("tcp", *listen)
	if err != nil {
		return err
	}
	srv := grpc.NewServer()
	keypb.RegisterKeyServiceServer(srv, keyservice.New(load, log))
	go func() { <-ctx.Done(); srv.GracefulStop() }()
	log.Info("key service listening", "addr", lis.Addr().String())
	return srv.Serve(lis)
}

// keyClient asks the key service over loopback.
type keyClient struct{ c keypb.KeyServiceClient }

func dialKeys(addr string) (*keyClient, error) {
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, err
	}
	return &keyClient{c: keypb.NewKeyServiceClient(conn)}, nil
}

func (k *keyClient) GetDataKey(ctx context.Context, id string, length int) ([]byte, error) {
	resp, err := k.c.GetDataKey(ctx, &keypb.GetDataKeyRequest{DataKeyId: id, Length: uint32(length)})
	if err != nil {
		return nil, err
	}
	return resp.GetDataKey(), nil
}
