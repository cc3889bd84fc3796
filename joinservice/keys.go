package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	iofs "io/fs"

	"net"
	"os"
	"path/filepath"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/orrery-dev/orrery/internal/logging"
	"github.com/orrery-dev/orrery/internal/proto/keypb"
	"github.com/orrery-dev/orrery/joinservice/internal/keyservice"
)

// DefaultKeyServiceSocket is the key service's unix socket. It lies in an
// emptyDir that only the join and key containers of the pod mount: the pod
// is on the host network, so a loopback port would answer every process
// and every host-network pod on the node.
const DefaultKeyServiceSocket = "/var/run/orrery/keyservice/keys.sock"

func runKeys(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("joinservice keys", flag.ExitOnError)
	listen := fs.String("listen", DefaultKeyServiceSocket, "unix socket to serve on, in a directory shared only with the join service")
	secretPath := fs.String("master-secret", "/var/run/orrery/master-secret/master-secret.json", "the master secret file (mounted from its Secret, mode 0400)")
	var level logging.Level
	logging.AddLevelFlag(fs, &level)
	_ = fs.Parse(args)
	log := logging.New(logging.Config{Program: "joinservice", Format: logging.JSON, Level: level, Output: os.Stderr})
	// Fail at start if the secret is unreadable, not at the first join.
	load := keyservice.FileLoader(*secretPath)
	if _, err := load(); err != nil {
		return err
	}
	lis, err := listenPrivate(*listen)
	if err != nil {
		return err
	}
	srv := grpc.NewServer(grpc.MaxRecvMsgSize(keyservice.MaxRequestSize))
	keypb.RegisterKeyServiceServer(srv, keyservice.New(load, log))
	go func() { <-ctx.Done(); srv.GracefulStop() }()
	log.Info("key service listening", "socket", *listen)
	return srv.Serve(lis)
}

// listenPrivate listens on the unix socket path, reachable only by this
// process's user: its directory is made 0700 (kubelet creates an emptyDir
// 0777) before the socket exists, so no other user can connect even in the
// moment before the socket itself is made 0600.
func listenPrivate(path string) (net.Listener, error) {
	if !filepath.IsAbs(path) {
		return nil, fmt.Errorf("--listen %s is not an absolute socket path: the key service serves only on a unix socket, never on a network address", path)
	}
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("create the key service's socket directory: %w", err)
	}
	if err := os.Chmod(dir, 0o700); err != nil {
		return nil, fmt.Errorf("restrict the key service's socket directory: %w", err)
	}
	// A socket left by an earlier run of this container would make Listen fail.
	if err := os.Remove(path); err != nil && !errors.Is(err, iofs.ErrNotExist) {
		return nil, fmt.Errorf("remove the old key service socket: %w", err)
	}
	lis, err := (&net.ListenConfig{}).Listen(context.Background(), "unix", path)
	if err != nil {
		return nil, err
	}
	if err := os.Chmod(path, 0o600); err != nil {
		lis.Close()
		return nil, fmt.Errorf("restrict the key service socket: %w", err)
	}
	return lis, nil
}

// keyClient asks the key service over its unix socket. No TLS: the
// socket's permissions decide who may ask, and the bytes never leave the
// kernel. The join service keeps it for its whole life.
type keyClient struct {
	conn *grpc.ClientConn
	c    keypb.KeyServiceClient
}

func dialKeys(socket string) (*keyClient, error) {
	conn, err := grpc.NewClient("unix://"+socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, err
	}
	return &keyClient{conn: conn, c: keypb.NewKeyServiceClient(conn)}, nil
}

// Close closes the connection.
func (k *keyClient) Close() error { return k.conn.Close() }

func (k *keyClient) GetDataKey(ctx context.Context, id string, length int) ([]byte, error) {
	resp, err := k.c.GetDataKey(ctx, &keypb.GetDataKeyRequest{DataKeyId: id, Length: uint32(length)})
	if err != nil {
		return nil, err
	}
	return resp.GetDataKey(), nil
}
