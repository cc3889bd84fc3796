package metadata

import (
	"encoding/json"
	"slices"
	"testing"
)

// The decoders read what an untrusted metadata service sends. They must
// not panic, and whatever they accept must survive a round trip.

func FuzzDecodeSelf(f *testing.F) {
	f.Add([]byte(`{"name":"cp-0","role":"control-plane","ip":"10.42.0.10"}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		in, err := decodeSelf(b)
		if err != nil {
			return
		}
		again, err := decodeSelf(mustJSON(in))
		if err != nil || again != in {
			t.Fatalf("round trip of %+v = %+v, %v", in, again, err)
		}
	})
}

func FuzzDecodePeers(f *testing.F) {
	f.Add([]byte(`[{"name":"cp-0","role":"control-plane","ip":"10.42.0.10"},{"name":"w-0","role":"worker","ip":"fd00::2"}]`))
	f.Fuzz(func(t *testing.T, b []byte) {
		ins, err := decodePeers(b)
		if err != nil {
			return
		}
		again, err := decodePeers(mustJSON(ins))
		if err != nil || !slices.Equal(again, ins) {
			t.Fatalf("round trip of %+v = %+v, %v", ins, again, err)
		}
	})
}

func FuzzDecodeEndpoint(f *testing.F) {
	f.Add([]byte(`{"endpoint":"10.42.0.10:6443"}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		ep, err := decodeEndpoint(b)
		if err != nil {
			return
		}
		again, err := decodeEndpoint(mustJSON(EndpointAnswer{Endpoint: ep.String()}))
		if err != nil || again != ep {
			t.Fatalf("round trip of %s = %s, %v", ep, again, err)
		}
	})
}

func FuzzDecodeInitSecretHash(f *testing.F) {
	f.Add([]byte(`{"hash":"$2a$04$abcdefghijklmnopqrstuu5Dn1J3hJ7wOPL3ZbuOGJmv8hmmd4Hqm"}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		h, err := decodeInitSecretHash(b)
		if err != nil {
			return
		}
		body, err := json.Marshal(InitSecretHashAnswer{Hash: string(h)})
		if err != nil {
			t.Fatal(err)
		}
		again, err := decodeInitSecretHash(body)
		if err != nil || string(again) != string(h) {
			t.Fatalf("round trip of %q = %q, %v", h, again, err)
		}
	})
}

func mustJSON(v any) []byte {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err)
	}
	return b
}
