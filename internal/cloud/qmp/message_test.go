package qmp

import (
	"bytes"
	"encoding/json"
	"testing"
	"time"
)

func TestDecodeMessage(t *testing.T) {
	tests := map[string]struct {
		line    string
		want    message
		wantErr bool
	}{
		"greeting": {
			line: greeting,
			want: message{kind: kindGreeting, version: "7.2.22"},
		},
		"reply": {
			line: `{"return": {"running": true}, "id": 7}` + "\r\n",
			want: message{kind: kindReply, id: "7", ret: json.RawMessage(`{"running": true}`)},
		},
		"reply with a string id": {
			line: `{"return": [], "id": "seven"}`,
			want: message{kind: kindReply, id: `"seven"`, ret: json.RawMessage(`[]`)},
		},
		"error reply without id": {
			line: `{"error": {"class": "GenericError", "desc": "JSON parse error, expecting value"}}`,
			want: message{kind: kindReply, err: &Error{Class: "GenericError", Desc: "JSON parse error, expecting value"}},
		},
		"event": {
			line: `{"timestamp": {"seconds": 1763700000, "microseconds": 250}, "event": "SHUTDOWN", "data": {"guest": true}}`,
			want: message{kind: kindEvent, event: Event{Name: "SHUTDOWN", Data: json.RawMessage(`{"guest": true}`), Time: time.Unix(1763700000, 250000)}},
		},
		"event wins over reply fields": {
			line: `{"event": "RESET", "return": {}, "id": 1}`,
			want: message{kind: kindEvent, event: Event{Name: "RESET"}},
		},
		"empty":              {line: "", wantErr: true},
		"blank":              {line: " \r\n", wantErr: true},
		"truncated":          {line: `{"return": {`, wantErr: true},
		"array":              {line: `[{"return": {}}]`, wantErr: true},
		"null":               {line: `null`, wantErr: true},
		"unknown object":     {line: `{"hello": 1}`, wantErr: true},
		"two objects":        {line: `{"return": {}} {"return": {}}`, wantErr: true},
		"event without name": {line: `{"event": ""}`, wantErr: true},
		"wrong field type":   {line: `{"error": "oops"}`, wantErr: true},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			got, err := decodeMessage([]byte(tc.line))
			if tc.wantErr {
				if err == nil {
					t.Fatalf("decodeMessage() = %+v, want an error", got)
				}
				return
			}
			if err != nil {
				t.Fatalf("decodeMessage() error = %v", err)
			}
			if !equalMessages(got, tc.want) {
				t.Fatalf("decodeMessage() = %+v, want %+v", got, tc.want)
			}
		})
	}
}

func equalMessages(a, b message) bool {
	return a.kind == b.kind && a.version == b.version && a.id == b.id &&
		bytes.Equal(a.ret, b.ret) && (a.err == nil) == (b.err == nil) && (a.err == nil || *a.err == *b.err) &&
		a.event.Name == b.event.Name && bytes.Equal(a.event.Data, b.event.Data) && a.event.Time.Equal(b.event.Time)
}

// FuzzDecodeMessage feeds the decoder what a broken or hostile QEMU could
// send. The decoder must not panic, and what it accepts must be exactly
// one well-formed sort of message.
func FuzzDecodeMessage(f *testing.F) {
	f.Add([]byte(greeting))
	f.Add([]byte(`{"return": {}, "id": 1}`))
	f.Add([]byte(`{"event": "STOP", "timestamp": {"seconds": 1, "microseconds": 2}}`))
	f.Fuzz(func(t *testing.T, line []byte) {
		msg, err := decodeMessage(line)
		if err != nil {
			return
		}
		switch msg.kind {
		case kindGreeting:
		case kindReply:
			if (msg.err == nil) == (msg.ret == nil) {
				t.Fatalf("reply %+v has both or neither of error and return", msg)
			}
		case kindEvent:
			if msg.event.Name == "" {
				t.Fatal("event without a name accepted")
			}
		default:
			t.Fatalf("accepted a message of unknown kind %d", msg.kind)
		}
		// Framing must not matter: the same object with QEMU's line end
		// decodes the same.
		again, err := decodeMessage(append(bytes.Clone(line), '\r', '\n'))
		if err != nil || !equalMessages(msg, again) {
			t.Fatalf("decoding with a line end differs: %+v, %v", again, err)
		}
	})
}
