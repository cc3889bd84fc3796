package hostkernel

import "testing"

func TestNewest(t *testing.T) {
	tests := map[string]struct {
		paths []string
		want  string
	}{
		"one": {
			paths: []string{"/boot/vmlinuz-6.1.0-56-cloud-amd64"},
			want:  "/boot/vmlinuz-6.1.0-56-cloud-amd64",
		},
		"numeric, not lexical": {
			paths: []string{"/boot/vmlinuz-6.1.0-9-cloud-amd64", "/boot/vmlinuz-6.1.0-56-cloud-amd64", "/boot/vmlinuz-6.1.0-10-cloud-amd64"},
			want:  "/boot/vmlinuz-6.1.0-56-cloud-amd64",
		},
		"major version wins": {
			paths: []string{"/boot/vmlinuz-6.12.0-1-cloud-amd64", "/boot/vmlinuz-6.1.0-99-cloud-amd64"},
			want:  "/boot/vmlinuz-6.12.0-1-cloud-amd64",
		},
		"leading zeros": {
			paths: []string{"/boot/vmlinuz-6.01.0-3-cloud-amd64", "/boot/vmlinuz-6.1.0-2-cloud-amd64"},
			want:  "/boot/vmlinuz-6.01.0-3-cloud-amd64",
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			if got := newest(tc.paths); got != tc.want {
				t.Fatalf("newest() = %s, want %s", got, tc.want)
			}
		})
	}
}
