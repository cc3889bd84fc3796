package verity

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
)

type fakeTool struct{ err error }

func (f fakeTool) OpenVerity(context.Context, string, string, string, string) error { return f.err }

func TestOpen(t *testing.T) {
	tests := map[string]struct {
		toolErr, mountErr error
		probe             bool
		wantMismatch      bool
		wantErr           bool
	}{
		"ok":                      {probe: true},
		"veritysetup fails":       {toolErr: errors.New("exit status 1"), wantMismatch: true, wantErr: true},
		"mount EIO":               {mountErr: unix.EIO, wantMismatch: true, wantErr: true},
		"mount ENODEV (no erofs)": {mountErr: unix.ENODEV, wantErr: true},
		"probe missing":           {wantErr: true},
	}
	for name, tt := range tests {
		t.Run(name, func(t *testing.T) {
			target := t.TempDir()
			if tt.probe {
				os.MkdirAll(filepath.Join(target, "sbin"), 0o755)
				os.WriteFile(filepath.Join(target, "sbin", "init"), []byte("x"), 0o755)
			}
			var mounted string
			r := &Root{
				Tool: fakeTool{tt.toolErr},
				Mount: func(source, _, fstype string, flags uintptr, _ string) error {
					if fstype != "erofs" || flags&unix.MS_RDONLY == 0 {
						t.Errorf("mount %s as %s, flags %#x", source, fstype, flags)
					}
					mounted = source
					return tt.mountErr
				},
				Probe: "sbin/init",
			}
			err := r.Open(context.Background(), "/dev/vda2", "/dev/vda3", "00", target)
			if (err != nil) != tt.wantErr || errors.Is(err, ErrMismatch) != tt.wantMismatch {
				t.Fatalf("Open() = %v, want error %v, mismatch %v", err, tt.wantErr, tt.wantMismatch)
			}
			if tt.toolErr == nil && mounted != "/dev/mapper/root" {
				t.Errorf("mounted %q", mounted)
			}
		})
	}
}
