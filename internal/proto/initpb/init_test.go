package initpb_test

import (
	"bytes"
	"testing"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	"github.com/orrery-dev/orrery/internal/proto/initpb"
)

// filled returns n bytes of value b, so that fields mixed up on the wire
// show up as different bytes.
func filled(b byte, n int) []byte {
	return bytes.Repeat([]byte{b}, n)
}

func TestInitRequestRoundTrip(t *testing.T) {
	want := &initpb.InitRequest{
		MasterSecret:      filled(0x01, 32),
		MasterSecretSalt:  filled(0x02, 32),
		MeasurementSalt:   filled(0x03, 32),
		KubernetesVersion: "v1.36.3",
		InitSecret:        []byte("correct horse battery staple"),
		ClusterName:       "orrery-test",
		ApiServerCertSans: []string{"api.example.com", "192.0.2.10", "2001:db8::1"},
		ServiceCidr:       "10.96.0.0/12",
	}

	wire, err := proto.Marshal(want)
	if err != nil {
		t.Fatalf("marshal: %v", err)
	}
	got := &initpb.InitRequest{}
	if err := proto.Unmarshal(wire, got); err != nil {
		t.Fatalf("unmarshal: %v", err)
	}

	if !proto.Equal(got, want) {
		t.Fatalf("round trip changed the request:\n got %v\nwant %v", got, want)
	}
	// The three secrets have the same size and type, so renumbering them in
	// init.proto would still round-trip here yet break every CLI and node
	// built before. Pin their field numbers on the wire.
	wantFields := map[protowire.Number][]byte{
		1: filled(0x01, 32), // master_secret
		2: filled(0x02, 32), // master_secret_salt
		3: filled(0x03, 32), // measurement_salt
	}
	for rest := wire; len(rest) > 0; {
		num, typ, n := protowire.ConsumeTag(rest)
		if n < 0 {
			t.Fatalf("parse tag: %v", protowire.ParseError(n))
		}
		rest = rest[n:]
		if w, ok := wantFields[num]; ok {
			if typ != protowire.BytesType {
				t.Fatalf("field %d has wire type %d, want bytes", num, typ)
			}
			v, m := protowire.ConsumeBytes(rest)
			if m < 0 {
				t.Fatalf("parse field %d: %v", num, protowire.ParseError(m))
			}
			if !bytes.Equal(v, w) {
				t.Errorf("field %d = %x, want %x", num, v, w)
			}
			delete(wantFields, num)
		}
		n = protowire.ConsumeFieldValue(num, typ, rest)
		if n < 0 {
			t.Fatalf("parse field %d: %v", num, protowire.ParseError(n))
		}
		rest = rest[n:]
	}
	for num := range wantFields {
		t.Errorf("field %d missing on the wire", num)
	}
}

// responseKind is which of InitResponse's oneof cases a message holds.
type responseKind int

const (
	none responseKind = iota
	progress
	logChunk
	success
	failure
)

func responseKindOf(t *testing.T, r *initpb.InitResponse) responseKind {
	t.Helper()
	switch r.GetKind().(type) {
	case nil:
		return none
	case *initpb.InitResponse_Progress:
		return progress
	case *initpb.InitResponse_Log:
		return logChunk
	case *initpb.InitResponse_Done:
		return success
	case *initpb.InitResponse_Failed:
		return failure
	default:
		t.Fatalf("unknown kind %T", r.GetKind())
		return none
	}
}

var initResponseKindCases = map[string]struct {
	msg  *initpb.InitResponse
	want responseKind
}{
	"success": {
		msg: &initpb.InitResponse{Kind: &initpb.InitResponse_Done{Done: &initpb.InitSuccess{
			Kubeconfig: []byte("apiVersion: v1\nkind: Config\n"),
			ClusterId:  filled(0xc1, 32),
		}}},
		want: success,
	},
	"failure with journal": {
		msg: &initpb.InitResponse{Kind: &initpb.InitResponse_Failed{Failed: &initpb.InitFailure{
			ErrorMessage: "run kubeadm init: exit status 1",
			Journal:      []byte("Jan 01 00:00:00 node kubelet[1]: failed\n"),
		}}},
		want: failure,
	},
	// A final message whose fields are all empty must still arrive as a
	// final message: the oneof case alone tells success from failure.
	"empty success": {
		msg:  &initpb.InitResponse{Kind: &initpb.InitResponse_Done{Done: &initpb.InitSuccess{}}},
		want: success,
	},
	"empty failure": {
		msg:  &initpb.InitResponse{Kind: &initpb.InitResponse_Failed{Failed: &initpb.InitFailure{}}},
		want: failure,
	},
	"progress": {
		msg: &initpb.InitResponse{Kind: &initpb.InitResponse_Progress{Progress: &initpb.Progress{
			Phase:   "kubeadm-init",
			Message: "running kubeadm init",
		}}},
		want: progress,
	},
	"log": {
		msg: &initpb.InitResponse{Kind: &initpb.InitResponse_Log{Log: &initpb.LogChunk{
			Source: "kubeadm",
			Data:   []byte("[init] Using Kubernetes version: v1.36.3\n"),
		}}},
		want: logChunk,
	},
	"no kind": {
		msg:  &initpb.InitResponse{},
		want: none,
	},
}

func TestInitResponseKind(t *testing.T) {
	for name, tc := range initResponseKindCases {
		t.Run(name, func(t *testing.T) {
			wire, err := proto.Marshal(tc.msg)
			if err != nil {
				t.Fatalf("marshal: %v", err)
			}
			got := &initpb.InitResponse{}
			if err := proto.Unmarshal(wire, got); err != nil {
				t.Fatalf("unmarshal: %v", err)
			}

			if k := responseKindOf(t, got); k != tc.want {
				t.Fatalf("kind after round trip = %d, want %d", k, tc.want)
			}
			if (got.GetDone() != nil) != (tc.want == success) {
				t.Errorf("GetDone() = %v, want it set only for a success", got.GetDone())
			}
			if (got.GetFailed() != nil) != (tc.want == failure) {
				t.Errorf("GetFailed() = %v, want it set only for a failure", got.GetFailed())
			}
			if !proto.Equal(got, tc.msg) {
				t.Errorf("round trip changed the message:\n got %v\nwant %v", got, tc.msg)
			}
		})
	}
}
