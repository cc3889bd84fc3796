package apiserver

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
)

// maxEvent bounds one event of a watch. It is larger than an answer's
// bound: a watched object may be as large as the API server stores
// (etcd takes 1.5 MiB, about 2 MiB in JSON), and a watch that stopped at
// one would stop at it again each time it started.
const maxEvent = maxCSRAnswer

// Event is one change a watch reports: Type is ADDED, MODIFIED, DELETED,
// BOOKMARK or ERROR, Object the object as JSON.
type Event struct {
	Type   string          `json:"type"`
	Object json.RawMessage `json:"object"`
}

// ErrWatchExpired means the watch's resource version is too old for the
// API server (410 Gone): list again and watch from the list's version.
var ErrWatchExpired = errors.New("the watch's resource version is too old: list again")

// Watch watches path (a list path with its query, which must hold
// watch=1) and calls each for every event, until ctx ends, the API server
// ends the watch (nil), each returns an error, or the stream breaks.
func (c *Conn) Watch(ctx context.Context, path string, each func(Event) error) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, c.Server+path, nil)
	if err != nil {
		return err
	}
	if c.Token != "" {
		req.Header.Set("Authorization", "Bearer "+c.Token)
	}
	// The answer lasts as long as the watch: the connection's client
	// has no overall timeout, the API server's timeoutSeconds ends it.
	client := &http.Client{Transport: c.HTTP.Transport}
	resp, err := client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode == http.StatusGone {
		return ErrWatchExpired
	}
	if resp.StatusCode != http.StatusOK {
		body, _ := io.ReadAll(io.LimitReader(resp.Body, maxResponse))
		return fmt.Errorf("watch: API server answered %d %s: %s", resp.StatusCode, http.StatusText(resp.StatusCode), Excerpt(body))
	}
	// The API server writes one event a line.
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 0, 64<<10), maxEvent)
	for sc.Scan() {
		var e Event
		if err := json.Unmarshal(sc.Bytes(), &e); err != nil {
			return fmt.Errorf("watch: an event of the API server's does not parse: %w", err)
		}
		if e.Type == "ERROR" {
			var st struct {
				Code    int    `json:"code"`
				Message string `json:"message"`
			}
			if json.Unmarshal(e.Object, &st) == nil && st.Code == http.StatusGone {
				return ErrWatchExpired
			}
			return fmt.Errorf("watch: the API server reported an error: %s", Excerpt(e.Object))
		}
		if err := each(e); err != nil {
			return err
		}
	}
	if err := sc.Err(); err != nil && ctx.Err() == nil {
		return fmt.Errorf("watch: read the API server's events: %w", err)
	}
	return nil
}
