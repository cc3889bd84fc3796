package versions

import (
	"errors"
	"slices"
	"testing"
)

func TestCheckUpgrade(t *testing.T) {
	for _, c := range []struct {
		from, to string
		want     error // nil: allowed
		anyErr   bool  // some error, without a sentinel
	}{
		{"v1.36.3", "v1.37.2", nil, false},
		{"v1.36.1", "v1.36.3", nil, false},
		{"v1.37.2", "v1.37.2", nil, false}, // an interrupted upgrade goes on
		{"v1.36.3", "v1.37.0", nil, false},
		{"v1.37.2", "v1.36.3", ErrDowngrade, false},
		{"v1.37.2", "v1.37.1", ErrDowngrade, false},
		{"v1.35.4", "v1.37.2", ErrSkipsMinor, false},
		{"v1.36.3", "v2.0.0", ErrSkipsMinor, false},
		{"v1.36", "v1.37.2", nil, true},
		{"v1.36.3", "latest", nil, true},
		{"", "v1.37.2", nil, true},
	} {
		err := CheckUpgrade(c.from, c.to)
		switch {
		case c.want == nil && !c.anyErr && err != nil:
			t.Errorf("CheckUpgrade(%q, %q) = %v, want nil", c.from, c.to, err)
		case c.anyErr && err == nil:
			t.Errorf("CheckUpgrade(%q, %q) = nil, want an error", c.from, c.to)
		case c.want != nil && !errors.Is(err, c.want):
			t.Errorf("CheckUpgrade(%q, %q) = %v, want %v", c.from, c.to, err, c.want)
		}
	}
}

func TestUpgradesFrom(t *testing.T) {
	vs := List()
	if len(vs) < 2 {
		t.Skip("the image carries one release")
	}
	oldest, newest := vs[0], vs[len(vs)-1]
	if got := UpgradesFrom(newest); len(got) != 0 {
		t.Errorf("UpgradesFrom(%s) = %v, want none: it is the newest", newest, got)
	}
	got := UpgradesFrom(oldest)
	if !slices.Contains(got, vs[1]) || slices.Contains(got, oldest) {
		t.Errorf("UpgradesFrom(%s) = %v, want the next release %s and not itself", oldest, got, vs[1])
	}
}
