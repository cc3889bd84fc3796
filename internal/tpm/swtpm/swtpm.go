// Package swtpm runs the swtpm software TPM 2.0 and connects Go code to it.
//
// It serves two users: unit tests, which need a real TPM without hardware, and
// the local cloud, which provisions a VM's vTPM (attestation key and its
// certificate) before the VM boots. Both talk raw TPM 2.0 commands over a Unix
// socket; Instance.Open hands out one connection at a time, as the kernel's
// resource manager (/dev/tpmrm0) does for separate processes.
package swtpm

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"path/filepath"
	"sync"
)

// Binary is the swtpm executable looked up in PATH.
const Binary = "swtpm"

// Instance is a running swtpm process with its state directory.
type Instance struct {
	*process
	sockPath string

	// conn is held by whoever has the TPM open; swtpm serves one client at
	// a time, so a second Open waits until the first is closed.
	conn chan struct{}
}

// Start launches swtpm with its TPM state in stateDir (created if missing; an
// existing state, e.g. a provisioned attestation key, is kept) and waits until
// it accepts connections or ctx ends.
func Start(ctx context.Context, stateDir string) (*Instance, error) {
	in := &Instance{conn: make(chan struct{}, 1)}
	p, err := launch(ctx, stateDir, func(sockDir string) []string {
		in.sockPath = filepath.Join(sockDir, "tpm.sock")
		return []string{
			"--server", "type=unixio,path=" + in.sockPath,
			"--ctrl", "type=unixio,path=" + filepath.Join(sockDir, "ctrl.sock"),
			"--flags", "not-need-init,startup-clear",
		}
	}, func(int) (bool, error) {
		c, err := (&net.Dialer{}).DialContext(context.Background(), "unix", in.sockPath)
		if err != nil {
			return false, err
		}
		c.Close()
		return true, nil
	})
	if err != nil {
		return nil, err
	}
	in.process = p
	return in, nil
}

// Open connects to the TPM. Only one connection is open at a time: Open
// blocks until the previous one is closed. Close the returned connection to
// release it.
func (in *Instance) Open() (io.ReadWriteCloser, error) {
	select {
	case in.conn <- struct{}{}:
	case <-in.exited:
		return nil, errors.New("swtpm is not running")
	}
	c, err := (&net.Dialer{}).DialContext(context.Background(), "unix", in.sockPath)
	if err != nil {
		<-in.conn
		return nil, fmt.Errorf("connect to swtpm: %w", err)
	}
	return &conn{c: c, release: func() { <-in.conn }}, nil
}

// Stop terminates swtpm (it saves its state on SIGTERM) and waits for it.
func (in *Instance) Stop() error {
	in.stop()
	return nil
}

// conn frames the socket's byte stream into whole TPM responses: go-tpm reads
// a response with a single Read, which a stream socket may split.
type conn struct {
	c       net.Conn
	once    sync.Once
	release func()
}

const headerSize = 10 // tag (2) + size (4) + response code (4)

func (c *conn) Write(p []byte) (int, error) { return c.c.Write(p) }

func (c *conn) Read(p []byte) (int, error) {
	var hdr [headerSize]byte
	if _, err := io.ReadFull(c.c, hdr[:]); err != nil {
		return 0, fmt.Errorf("read TPM response header: %w", err)
	}
	size := int(binary.BigEndian.Uint32(hdr[2:6]))
	if size < headerSize || size > len(p) {
		return 0, fmt.Errorf("TPM response of %d bytes does not fit a %d-byte buffer", size, len(p))
	}
	copy(p, hdr[:])
	if _, err := io.ReadFull(c.c, p[headerSize:size]); err != nil {
		return 0, fmt.Errorf("read TPM response body: %w", err)
	}
	return size, nil
}

func (c *conn) Close() error {
	var err error
	c.once.Do(func() {
		err = c.c.Close()
		c.release()
	})
	return err
}
