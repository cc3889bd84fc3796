package keyservice

import (
	"bytes"
	"context"
	"log/slog"
	"math"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/orrery-dev/orrery/internal/keys"
	"github.com/orrery-dev/orrery/internal/proto/keypb"
)

func TestRequestsAreBounded(t *testing.T) {
	ms := keys.MasterSecret{Key: bytes.Repeat([]byte{1}, 32), Salt: bytes.Repeat([]byte{2}, 32)}
	tests := map[string]struct {
		req      *keypb.GetDataKeyRequest
		wantCode codes.Code
		wantMsg  string
	}{
		"1 GiB key":                   {&keypb.GetDataKeyRequest{DataKeyId: "disk:x", Length: 1 << 30}, codes.InvalidArgument, "a data key has 16 to 64 bytes, not 1073741824"},
		"4 GiB key":                   {&keypb.GetDataKeyRequest{DataKeyId: "disk:x", Length: math.MaxUint32}, codes.InvalidArgument, "not 4294967295"},
		"1 GiB measurement secret":    {&keypb.GetDataKeyRequest{DataKeyId: keypb.MeasurementSecretID, Length: 1 << 30}, codes.InvalidArgument, "measurement-secret has 32 bytes"},
		"key ID at the limit":         {&keypb.GetDataKeyRequest{DataKeyId: strings.Repeat("k", maxKeyID), Length: 32}, codes.OK, ""},
		"key ID over the limit":       {&keypb.GetDataKeyRequest{DataKeyId: strings.Repeat("k", maxKeyID+1), Length: 32}, codes.InvalidArgument, "the key ID has 129 bytes, at most 128"},
		"largest request on the wire": {largest(MaxRequestSize), codes.InvalidArgument, "the key ID has 1019 bytes"},
		"4 MiB key ID":                {&keypb.GetDataKeyRequest{DataKeyId: strings.Repeat("k", 4<<20), Length: 32}, codes.InvalidArgument, "the key ID has 4194304 bytes"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			var loads int
			var log bytes.Buffer
			s := New(func() (keys.MasterSecret, error) { loads++; return ms, nil }, slog.New(slog.NewJSONHandler(&log, nil)))
			resp, err := s.GetDataKey(context.Background(), tc.req)
			st := status.Convert(err)
			if st.Code() != tc.wantCode || !strings.Contains(st.Message(), tc.wantMsg) || len(st.Message()) > 100 {
				t.Fatalf("status %v %.200q, want %v containing %q, at most 100 bytes", st.Code(), st.Message(), tc.wantCode, tc.wantMsg)
			}
			if tc.wantCode != codes.OK && (loads != 0 || resp != nil) {
				t.Fatalf("a refused request read the master secret %d times", loads)
			}
			if log.Len() > 1<<10 {
				t.Fatalf("the request logged %d bytes", log.Len())
			}
		})
	}
}

// largest is a request of exactly size bytes on the wire.
func largest(size int) *keypb.GetDataKeyRequest {
	req := &keypb.GetDataKeyRequest{Length: 32}
	for range 4 { // the ID's length prefix changes with it
		if d := size - proto.Size(req); d >= 0 {
			req.DataKeyId += strings.Repeat("k", d)
		} else {
			req.DataKeyId = req.DataKeyId[:len(req.DataKeyId)+d]
		}
	}
	return req
}

func TestLargestValidRequestFits(t *testing.T) {
	req := &keypb.GetDataKeyRequest{DataKeyId: strings.Repeat("k", maxKeyID), Length: keys.MaxKeyLength}
	if err := check(req); err != nil {
		t.Fatal(err)
	}
	if n := proto.Size(req); n > MaxRequestSize {
		t.Fatalf("the largest valid request has %d bytes, MaxRequestSize is %d", n, MaxRequestSize)
	}
}
