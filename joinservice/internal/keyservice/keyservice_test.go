package keyservice

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"errors"
	"path/filepath"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/orrery-dev/orrery/internal/keys"
	"github.com/orrery-dev/orrery/internal/proto/keypb"
)

func TestGetDataKey(t *testing.T) {
	ms := keys.MasterSecret{Key: bytes.Repeat([]byte{1}, 32), Salt: bytes.Repeat([]byte{2}, 32)}
	path := filepath.Join(t.TempDir(), "master-secret.json")
	if err := keys.WriteMasterSecretFile(path, ms); err != nil {
		t.Fatal(err)
	}
	s := New(FileLoader(path), nil)
	wantDisk, _ := ms.DiskKey("0b5c1f3e-8d2a-4c6b-9e7f-1a2b3c4d5e6f")
	wantMS, _ := ms.MeasurementSecret()
	owner, _ := ms.OwnerAccessKey()
	tests := map[string]struct {
		id       string
		length   uint32
		want     []byte
		wantCode codes.Code
	}{
		"disk key":                  {id: "disk:0b5c1f3e-8d2a-4c6b-9e7f-1a2b3c4d5e6f", length: 32, want: wantDisk},
		"measurement secret":        {id: keypb.MeasurementSecretID, length: 32, want: wantMS},
		"measurement secret length": {id: keypb.MeasurementSecretID, length: 16, wantCode: codes.InvalidArgument},
		"owner access key":          {id: keypb.OwnerAccessKeyID, length: 32, want: owner.Public().(ed25519.PublicKey)},
		"owner access key length":   {id: keypb.OwnerAccessKeyID, length: 64, wantCode: codes.InvalidArgument},
		"empty ID":                  {id: "", length: 32, wantCode: codes.InvalidArgument},
		"too short":                 {id: "x", length: 8, wantCode: codes.InvalidArgument},
		"too long":                  {id: "x", length: 4096, wantCode: codes.InvalidArgument},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			resp, err := s.GetDataKey(context.Background(), &keypb.GetDataKeyRequest{DataKeyId: tc.id, Length: tc.length})
			if tc.wantCode != codes.OK {
				if status.Code(err) != tc.wantCode {
					t.Fatalf("err = %v, want %v", err, tc.wantCode)
				}
				return
			}
			if err != nil || !bytes.Equal(resp.GetDataKey(), tc.want) {
				t.Fatalf("key %x, %v; want %x", resp.GetDataKey(), err, tc.want)
			}
		})
	}
}

func TestUnreadableSecretIsUnavailable(t *testing.T) {
	s := New(func() (keys.MasterSecret, error) { return keys.MasterSecret{}, errors.New("gone") }, nil)
	_, err := s.GetDataKey(context.Background(), &keypb.GetDataKeyRequest{DataKeyId: "x", Length: 32})
	if status.Code(err) != codes.Unavailable {
		t.Fatalf("err = %v, want Unavailable", err)
	}
}
