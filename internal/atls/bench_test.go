package atls_test

import (
	"testing"

	"github.com/orrery-dev/orrery/internal/atls"
	"github.com/orrery-dev/orrery/internal/attestation"
)

// BenchmarkHandshakeAndRPC measures what a join costs on the wire: a new
// connection (TLS 1.3 handshake, quote by swtpm, validation) plus one RPC.
func BenchmarkHandshakeAndRPC(b *testing.B) {
	e := newEnv(b)
	for _, side := range []string{"server attests", "client attests"} {
		b.Run(side, func(b *testing.B) {
			srv, cli := atls.Config{Issuer: e.issuer}, atls.Config{Validators: []attestation.Validator{e.validator(b, e.want)}}
			if side == "client attests" {
				srv, cli = cli, srv
			}
			addr, seen := serve(b, srv)
			b.ResetTimer()
			for b.Loop() {
				if err := call(b, addr, cli); err != nil {
					b.Fatal(err)
				}
				<-seen
			}
		})
	}
}
