package blockdev

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// fakeSysfs builds a sysfs tree with the given files (relative path ->
// contents).
func fakeSysfs(t *testing.T, files map[string]string) string {
	t.Helper()
	root := t.TempDir()
	for name, content := range files {
		p := filepath.Join(root, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return root
}

func TestBySerial(t *testing.T) {
	tests := map[string]struct {
		files   map[string]string
		want    string
		wantErr string
	}{
		"found": {
			files: map[string]string{
				"block/vda/serial": "",
				"block/vdb/serial": "state\n",
				"block/sr0/size":   "0",
			},
			want: "/dev/vdb",
		},
		"missing": {
			files:   map[string]string{"block/vda/serial": "root"},
			wantErr: "not found",
		},
		"no block devices at all": {
			files:   map[string]string{"block/.keep": ""},
			wantErr: "not found",
		},
		"two": {
			files:   map[string]string{"block/vda/serial": "state", "block/vdb/serial": "state"},
			wantErr: "more than one disk with serial \"state\": /dev/vda, /dev/vdb",
		},
		"prefix is not a match": {
			files:   map[string]string{"block/vda/serial": "state2"},
			wantErr: "not found",
		},
	}
	for name, tt := range tests {
		t.Run(name, func(t *testing.T) {
			got, err := BySerial(fakeSysfs(t, tt.files), "state")
			checkResult(t, got, err, tt.want, tt.wantErr)
		})
	}
}

func TestByPartName(t *testing.T) {
	part := func(dev, name string) string {
		return "MAJOR=254\nMINOR=2\nDEVNAME=" + dev + "\nDEVTYPE=partition\nPARTN=2\nPARTNAME=" + name + "\n"
	}
	tests := map[string]struct {
		files   map[string]string
		want    string
		wantErr string
	}{
		"found": {
			files: map[string]string{
				"class/block/vda/uevent":  "MAJOR=254\nMINOR=0\nDEVNAME=vda\nDEVTYPE=disk\n",
				"class/block/vda1/uevent": part("vda1", "esp"),
				"class/block/vda2/uevent": part("vda2", "orrery-root"),
				"class/block/vda3/uevent": part("vda3", "orrery-verity"),
			},
			want: "/dev/vda2",
		},
		"a whole disk is never a match": {
			files:   map[string]string{"class/block/vda/uevent": "DEVNAME=vda\nDEVTYPE=disk\nPARTNAME=orrery-root\n"},
			wantErr: "not found",
		},
		"two": {
			files: map[string]string{
				"class/block/vda2/uevent": part("vda2", "orrery-root"),
				"class/block/vdb2/uevent": part("vdb2", "orrery-root"),
			},
			wantErr: "more than one partition",
		},
		"missing": {
			files:   map[string]string{"class/block/vda1/uevent": part("vda1", "orrery-root-b")},
			wantErr: "not found",
		},
	}
	for name, tt := range tests {
		t.Run(name, func(t *testing.T) {
			got, err := ByPartName(fakeSysfs(t, tt.files), "orrery-root")
			checkResult(t, got, err, tt.want, tt.wantErr)
		})
	}
}

func checkResult(t *testing.T, got string, err error, want, wantErr string) {
	t.Helper()
	if wantErr != "" {
		if err == nil || !strings.Contains(err.Error(), wantErr) {
			t.Fatalf("error = %v, want one containing %q", err, wantErr)
		}
		return
	}
	if err != nil || got != want {
		t.Fatalf("got %q, %v; want %q", got, err, want)
	}
}

func TestWait(t *testing.T) {
	calls := 0
	dev, err := Wait(context.Background(), time.Second, time.Millisecond, func() (string, error) {
		calls++
		if calls < 3 {
			return "", ErrNotFound
		}
		return "/dev/vdb", nil
	})
	if err != nil || dev != "/dev/vdb" {
		t.Fatalf("Wait() = %q, %v", dev, err)
	}
	_, err = Wait(context.Background(), 20*time.Millisecond, time.Millisecond, func() (string, error) {
		return "", ErrNotFound
	})
	if !errors.Is(err, ErrNotFound) {
		t.Fatalf("Wait() after timeout = %v, want ErrNotFound", err)
	}
	boom := errors.New("boom")
	if _, err := Wait(context.Background(), time.Second, time.Millisecond, func() (string, error) { return "", boom }); !errors.Is(err, boom) {
		t.Fatalf("Wait() = %v, want boom at once", err)
	}
}
