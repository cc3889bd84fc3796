package buildinfo

import "testing"

func TestGet(t *testing.T) {
	defer func(v string) { Version = v }(Version)
	for v, want := range map[string]string{
		"0.2.0":        "0.2.0",
		"1.4.0-rc.1":   "1.4.0-rc.1",
		"v0.2.0":       "0.0.0-invalid", // the "v" belongs to tags, not to chart versions
		"0.2":          "0.0.0-invalid",
		"0.2.0+abc":    "0.0.0-invalid", // no build metadata: Kubernetes labels carry the version
		"":             "0.0.0-invalid",
		"0.2.0; rm -r": "0.0.0-invalid",
	} {
		Version = v
		if got := Get().Version; got != want {
			t.Errorf("Version %q: Get().Version = %q, want %q", v, got, want)
		}
	}
}

func TestString(t *testing.T) {
	for _, tc := range []struct {
		info Info
		want string
	}{
		{Info{Version: "0.2.0"}, "0.2.0"},
		{Info{Version: "0.2.0", Commit: "6459f67aabbccddeeff00112233445566778899a"}, "0.2.0 (6459f67aabbc)"},
		{Info{Version: "0.2.0", Commit: "6459f67", Modified: true}, "0.2.0 (6459f67-dirty)"},
	} {
		if got := tc.info.String(); got != tc.want {
			t.Errorf("%+v.String() = %q, want %q", tc.info, got, tc.want)
		}
	}
}
