package qmp

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"time"
)

// Error is an error QEMU returned for a command: {"error": {"class", "desc"}}.
// Class is one of QEMU's error classes (GenericError, CommandNotFound,
// DeviceNotActive, DeviceNotFound, KVMMissingCap); Desc is QEMU's message.
type Error struct {
	Class string
	Desc  string
}

func (e *Error) Error() string { return e.Class + ": " + e.Desc }

// Event is an asynchronous event QEMU sent, e.g. SHUTDOWN, RESET or STOP.
type Event struct {
	Name string
	// Data is the event's "data" object, raw; nil if it had none.
	Data json.RawMessage
	// Time is when QEMU emitted the event (its clock, microsecond precision).
	Time time.Time
}

// kind tells the three sorts of messages a QMP server sends apart.
type kind int

const (
	kindGreeting kind = iota + 1
	kindReply
	kindEvent
)

// message is one decoded server message.
type message struct {
	kind kind
	// Greeting.
	version string
	// Reply: id is the raw JSON of the echoed "id" (empty if QEMU sent none,
	// which it does only for requests it could not parse); err is set for
	// an error reply, ret otherwise.
	id  string
	ret json.RawMessage
	err *Error
	// Event.
	event Event
}

// wireMessage is the union of the server messages' fields. A pointer or
// raw field that stays nil was absent.
type wireMessage struct {
	QMP *struct {
		Version struct {
			QEMU struct {
				Major int `json:"major"`
				Minor int `json:"minor"`
				Micro int `json:"micro"`
			} `json:"qemu"`
			Package string `json:"package"`
		} `json:"version"`
	} `json:"QMP"`
	Return json.RawMessage `json:"return"`
	Error  *struct {
		Class string `json:"class"`
		Desc  string `json:"desc"`
	} `json:"error"`
	ID        json.RawMessage `json:"id"`
	Event     *string         `json:"event"`
	Data      json.RawMessage `json:"data"`
	Timestamp *struct {
		Seconds      int64 `json:"seconds"`
		Microseconds int64 `json:"microseconds"`
	} `json:"timestamp"`
}

var errNotObject = errors.New("not a JSON object")

// decodeMessage decodes one line QEMU sent. It fails on anything that is
// not exactly one JSON object of a known sort, so that a confused peer is
// noticed instead of leaving a command without its reply.
func decodeMessage(line []byte) (message, error) {
	line = bytes.TrimSpace(line)
	if len(line) == 0 || line[0] != '{' {
		return message{}, errNotObject
	}
	var w wireMessage
	dec := json.NewDecoder(bytes.NewReader(line))
	if err := dec.Decode(&w); err != nil {
		return message{}, err
	}
	// One message per line: trailing data means framing went wrong.
	if dec.More() {
		return message{}, errors.New("trailing data after the JSON object")
	}
	switch {
	case w.QMP != nil:
		v := w.QMP.Version.QEMU
		return message{kind: kindGreeting, version: fmt.Sprintf("%d.%d.%d", v.Major, v.Minor, v.Micro)}, nil
	case w.Event != nil:
		if *w.Event == "" {
			return message{}, errors.New("event without a name")
		}
		ev := Event{Name: *w.Event}
		if len(w.Data) > 0 && !bytes.Equal(w.Data, []byte("null")) {
			ev.Data = w.Data
		}
		if ts := w.Timestamp; ts != nil {
			ev.Time = time.Unix(ts.Seconds, ts.Microseconds*int64(time.Microsecond))
		}
		return message{kind: kindEvent, event: ev}, nil
	case w.Error != nil:
		return message{kind: kindReply, id: string(w.ID), err: &Error{Class: w.Error.Class, Desc: w.Error.Desc}}, nil
	case w.Return != nil:
		return message{kind: kindReply, id: string(w.ID), ret: w.Return}, nil
	}
	return message{}, errors.New("neither greeting, reply nor event")
}
