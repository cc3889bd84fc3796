// Package sdsocket gives a daemon the one listening socket systemd passed
// it (socket activation), or a socket of its own on an address given by
// hand (tests, and a daemon started outside systemd).
package sdsocket

import (
	"context"
	"errors"
	"fmt"
	"net"

	"github.com/coreos/go-systemd/v22/activation"
)

// Listen listens on addr if it is set; otherwise it returns the socket
// that systemd passed, which must be exactly one. unit names the socket
// unit in the error that says how to start the daemon.
func Listen(addr, unit string) (net.Listener, error) {
	if addr != "" {
		lis, err := (&net.ListenConfig{}).Listen(context.Background(), "tcp", addr)
		if err != nil {
			return nil, fmt.Errorf("listen on %s: %w", addr, err)
		}
		return lis, nil
	}
	lis, err := activation.Listeners()
	if err != nil {
		return nil, fmt.Errorf("sockets from systemd: %w", err)
	}
	if len(lis) != 1 || lis[0] == nil {
		return nil, errors.New("expected exactly one listening socket from systemd (" + unit + "); start it through systemd or pass --listen")
	}
	return lis[0], nil
}
