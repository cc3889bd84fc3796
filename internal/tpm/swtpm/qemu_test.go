package swtpm

import (
	"context"
	"encoding/binary"
	"io"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// Commands of swtpm's control channel (swtpm's tpm_ioctl.h), as QEMU
// sends them.
const (
	ctrlGetCapability = 1
	ctrlShutdown      = 3
)

// ctrlCommand sends a control command without payload and returns the
// response's first 32-bit word (for most commands, the result code).
func ctrlCommand(t *testing.T, c net.Conn, cmd uint32, respSize int) uint32 {
	t.Helper()
	if err := binary.Write(c, binary.BigEndian, cmd); err != nil {
		t.Fatalf("send control command %d: %v", cmd, err)
	}
	resp := make([]byte, respSize)
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.ReadFull(c, resp); err != nil {
		t.Fatalf("read response to control command %d: %v", cmd, err)
	}
	return binary.BigEndian.Uint32(resp)
}

func startForQEMU(t *testing.T) *QEMUInstance {
	t.Helper()
	in, err := StartForQEMU(context.Background(), filepath.Join(t.TempDir(), "tpm"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { in.Stop() })
	return in
}

func waitExit(t *testing.T, in *QEMUInstance, within time.Duration) bool {
	t.Helper()
	select {
	case <-in.Exited():
		return true
	case <-time.After(within):
		return false
	}
}

// TestQEMUInstanceLifecycle checks what the VM code relies on: swtpm exits
// by itself when QEMU shuts down in order (QEMU sends CMD_SHUTDOWN), keeps
// running when its QEMU is killed (the connection just drops), and Stop
// ends it in either case without leaving the socket directory behind.
func TestQEMUInstanceLifecycle(t *testing.T) {
	tests := map[string]struct {
		qemu     func(t *testing.T, c net.Conn) // plays QEMU on the control socket
		wantExit bool                           // swtpm exits without Stop
	}{
		"orderly QEMU exit": {
			qemu: func(t *testing.T, c net.Conn) {
				if rc := ctrlCommand(t, c, ctrlShutdown, 4); rc != 0 {
					t.Fatalf("CMD_SHUTDOWN result = %#x, want 0", rc)
				}
				c.Close()
			},
			wantExit: true,
		},
		"QEMU killed": {
			qemu: func(t *testing.T, c net.Conn) { c.Close() },
		},
		"never connected": {
			qemu: func(t *testing.T, c net.Conn) {},
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			in := startForQEMU(t)
			c, err := net.Dial("unix", in.CtrlSocket())
			if err != nil {
				t.Fatalf("connect to the control socket: %v", err)
			}
			defer c.Close()
			// GET_CAPABILITY answers a bare 64-bit capability mask, as
			// QEMU's first probe expects.
			ctrlCommand(t, c, ctrlGetCapability, 8)
			tc.qemu(t, c)
			if exited := waitExit(t, in, time.Second); exited != tc.wantExit {
				t.Fatalf("swtpm exited on its own: %v, want %v", exited, tc.wantExit)
			}
			start := time.Now()
			if err := in.Stop(); err != nil {
				t.Fatal(err)
			}
			if d := time.Since(start); d > 2*time.Second {
				t.Errorf("Stop took %v: swtpm ignored SIGTERM", d)
			}
			if err := in.Wait(context.Background()); err != nil {
				t.Errorf("Wait() = %v, want a clean exit", err)
			}
			if _, err := os.Stat(filepath.Dir(in.CtrlSocket())); !os.IsNotExist(err) {
				t.Errorf("socket directory left behind (stat: %v)", err)
			}
		})
	}
}
