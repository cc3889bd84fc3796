package statuslimit

import (
	"errors"
	"strings"
	"testing"
	"unicode/utf8"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

func TestCut(t *testing.T) {
	long := strings.Repeat("é", MaxMessage) // two bytes each: a cut can fall inside one
	tests := map[string]struct {
		err     error
		wantLen int // of the message; -1: the error itself comes back
	}{
		"nil":                {err: nil, wantLen: -1},
		"not a status":       {err: errors.New(long), wantLen: -1},
		"short status":       {err: status.Error(codes.InvalidArgument, "bad"), wantLen: -1},
		"long status":        {err: status.Error(codes.InvalidArgument, long), wantLen: MaxMessage},
		"exactly MaxMessage": {err: status.Error(codes.Internal, strings.Repeat("a", MaxMessage)), wantLen: -1},
		"one byte too long":  {err: status.Error(codes.Internal, strings.Repeat("a", MaxMessage+1)), wantLen: MaxMessage},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			got := Cut(tc.err)
			if tc.wantLen < 0 {
				if got != tc.err { //nolint:errorlint // the very error, unchanged
					t.Fatalf("Cut changed %v into %v", tc.err, got)
				}
				return
			}
			st, _ := status.FromError(got)
			msg := st.Message()
			if len(msg) > tc.wantLen || !utf8.ValidString(msg) || !strings.HasSuffix(msg, "(cut)") || st.Code() != status.Code(tc.err) {
				t.Fatalf("Cut = %d bytes, valid UTF-8 %v, code %v: %.40q...", len(msg), utf8.ValidString(msg), st.Code(), msg)
			}
		})
	}
}
