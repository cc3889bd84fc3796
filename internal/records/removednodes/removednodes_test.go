package removednodes

import (
	"strings"
	"testing"
	"time"
)

func TestParse(t *testing.T) {
	at := time.Date(2026, 11, 27, 12, 0, 0, 0, time.UTC)
	good := Entry{InstanceID: "42", RemovedAt: at}.Value()
	tests := map[string]struct {
		data    map[string]string
		wantErr string
	}{
		"empty":             {data: nil},
		"one":               {data: map[string]string{"worker-1": good}},
		"not a node name":   {data: map[string]string{"Worker_1": good}, wantErr: "not a node name"},
		"not JSON":          {data: map[string]string{"worker-1": "x"}, wantErr: "the entry of node worker-1"},
		"too long":          {data: map[string]string{"worker-1": strings.Repeat(" ", maxEntry+1)}, wantErr: "more than"},
		"time not RFC 3339": {data: map[string]string{"worker-1": `{"removedAt":"yesterday"}`}, wantErr: "worker-1"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			l, err := Parse(tc.data)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err = %v, want %q", err, tc.wantErr)
				}
				return
			}
			if err != nil || len(l) != len(tc.data) {
				t.Fatalf("Parse = %v, %v", l, err)
			}
		})
	}
}

func TestFind(t *testing.T) {
	l := List{"worker-1": {InstanceID: "42"}, "worker-2": {}}
	for name, tc := range map[string]struct {
		name, id, wantName string
		found              bool
	}{
		"by name":                     {name: "worker-1", id: "7", wantName: "worker-1", found: true},
		"by instance under new name":  {name: "worker-9", id: "42", wantName: "worker-1", found: true},
		"listed without an instance":  {name: "worker-2", wantName: "worker-2", found: true},
		"another node":                {name: "worker-3", id: "43"},
		"no instance ID matches none": {name: "worker-3", id: ""},
	} {
		if n, _, ok := l.Find(tc.name, tc.id); ok != tc.found || n != tc.wantName {
			t.Errorf("%s: Find = %q, %v; want %q, %v", name, n, ok, tc.wantName, tc.found)
		}
	}
}

// The list is the owner's, but a parser of what the API server returns
// must not panic on anything.
func FuzzParse(f *testing.F) {
	f.Add("worker-1", Entry{InstanceID: "42", RemovedAt: time.Unix(0, 0)}.Value())
	f.Add("x", `{"instanceID":1}`)
	f.Fuzz(func(t *testing.T, k, v string) {
		l, err := Parse(map[string]string{k: v})
		if err == nil && len(l) != 1 {
			t.Fatalf("accepted %q=%q into %v", k, v, l)
		}
	})
}
