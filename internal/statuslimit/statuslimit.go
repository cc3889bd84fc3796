// Package statuslimit bounds the gRPC errors a node's servers send to
// peers that have not proved anything yet (init, recovery): an error that
// quotes a request, or a tool's output, must not grow with it.
package statuslimit

import (
	"unicode/utf8"

	"google.golang.org/grpc/status"
)

// MaxMessage is the most an error's message may say: enough for every
// error a real request meets, with its advice.
const MaxMessage = 2 << 10

// Cut returns err with its status message cut to MaxMessage bytes, at a
// character boundary, saying that it was cut; other errors, and short
// messages, are returned as they are.
func Cut(err error) error {
	st, ok := status.FromError(err)
	if !ok || err == nil || len(st.Message()) <= MaxMessage {
		return err
	}
	return status.Error(st.Code(), cutString(st.Message(), MaxMessage))
}

func cutString(msg string, n int) string {
	const more = " ... (cut)"
	cut := n - len(more)
	for cut > 0 && !utf8.RuneStart(msg[cut]) {
		cut--
	}
	return msg[:cut] + more
}
