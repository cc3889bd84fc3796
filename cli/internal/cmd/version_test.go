package cmd

import (
	"bytes"
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/orrery-dev/orrery/internal/buildinfo"
)

func TestVersion(t *testing.T) {
	defer func(v string) { buildinfo.Version = v }(buildinfo.Version)
	buildinfo.Version = "0.9.1"
	var out, errOut bytes.Buffer
	if code := Execute(context.Background(), []string{"version"}, &out, &errOut); code != 0 {
		t.Fatalf("exit %d: %s", code, errOut.String())
	}
	for _, want := range []string{"orrery      0.9.1", "v1.36.3", "flannel          kube-system  flannel          0.9.1", "orrery-services  kube-system  orrery-services  0.9.1"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, out.String())
		}
	}

	out.Reset()
	if code := Execute(context.Background(), []string{"version", "-o", "json"}, &out, &errOut); code != 0 {
		t.Fatalf("exit %d: %s", code, errOut.String())
	}
	var r versionReport
	if err := json.Unmarshal(out.Bytes(), &r); err != nil {
		t.Fatalf("-o json is not JSON: %v\n%s", err, out.String())
	}
	if r.Orrery.Version != "0.9.1" || len(r.Releases) != 3 || r.Releases[2].ChartVersion != "0.9.1" || len(r.KubernetesVersions) == 0 {
		t.Fatalf("JSON report %+v", r)
	}

	out.Reset()
	if code := Execute(context.Background(), []string{"version", "-o", "yaml"}, &out, &errOut); code != 0 || !strings.Contains(out.String(), "version: 0.9.1") {
		t.Fatalf("-o yaml: exit %d, %q\n%s", code, errOut.String(), out.String())
	}
	errOut.Reset()
	if code := Execute(context.Background(), []string{"version", "-o", "xml"}, &out, &errOut); code == 0 || !strings.Contains(errOut.String(), "use text, json, yaml or jsonpath=TEMPLATE") {
		t.Fatalf("-o xml: exit %d, %q", code, errOut.String())
	}
}
