package clustersettings

import (
	"errors"
	"strings"
	"testing"
)

func onlyV1363(v string) error {
	if v != "v1.36.3" {
		return errors.New("this image ships Kubernetes v1.36.3 only")
	}
	return nil
}

func TestValidate(t *testing.T) {
	good := Settings{KubernetesVersion: "v1.36.3", ClusterName: "orrery", APIServerSANs: []string{"10.42.1.100", "api.example.org", "fd00::1"}, ServiceCIDR: "10.96.0.0/12", ControlPlaneEndpoint: "10.42.0.2:6443"}
	if err := good.Validate(onlyV1363); err != nil {
		t.Fatalf("the defaults are refused: %v", err)
	}
	tests := map[string]struct {
		change func(*Settings)
		want   string
	}{
		"version":          {func(s *Settings) { s.KubernetesVersion = "banana" }, "ships Kubernetes v1.36.3 only"},
		"long version":     {func(s *Settings) { s.KubernetesVersion = strings.Repeat("1", 40) }, "longer than 32 bytes"},
		"name uppercase":   {func(s *Settings) { s.ClusterName = "Bad_Name" }, `cluster name "Bad_Name" is not a DNS label`},
		"name empty":       {func(s *Settings) { s.ClusterName = "" }, "is not a DNS label"},
		"name dash end":    {func(s *Settings) { s.ClusterName = "a-" }, "is not a DNS label"},
		"SAN":              {func(s *Settings) { s.APIServerSANs = []string{"ok.example", "not ok", "_x"} }, `2 of 3 are not: "not ok", "_x"`},
		"CIDR garbage":     {func(s *Settings) { s.ServiceCIDR = "garbage" }, `service CIDR "garbage" is not an IP range`},
		"CIDR host bits":   {func(s *Settings) { s.ServiceCIDR = "10.96.0.1/12" }, "did you mean 10.96.0.0/12?"},
		"CIDR small":       {func(s *Settings) { s.ServiceCIDR = "10.96.0.0/30" }, "too small"},
		"CIDR large":       {func(s *Settings) { s.ServiceCIDR = "10.0.0.0/8" }, "too large"},
		"CIDR IPv6":        {func(s *Settings) { s.ServiceCIDR = "fd00::/112" }, "not IPv4"},
		"CIDR pod overlap": {func(s *Settings) { s.ServiceCIDR = "10.244.128.0/20" }, "overlaps the pods' range 10.244.0.0/16"},
		"endpoint no port": {func(s *Settings) { s.ControlPlaneEndpoint = "10.42.0.2" }, "is not HOST:PORT"},
		"endpoint port 0":  {func(s *Settings) { s.ControlPlaneEndpoint = "10.42.0.2:0" }, "not a number from 1 to 65535"},
		"endpoint port +1": {func(s *Settings) { s.ControlPlaneEndpoint = "10.42.0.2:+1" }, "not a number from 1 to 65535"},
		"endpoint host":    {func(s *Settings) { s.ControlPlaneEndpoint = "bad host:6443" }, "neither an IP address without a zone nor a DNS name"},
		"endpoint zone":    {func(s *Settings) { s.ControlPlaneEndpoint = "[fe80::1%eth0]:6443" }, "without a zone"},
		"endpoint long":    {func(s *Settings) { s.ControlPlaneEndpoint = strings.Repeat("a", 300) + ":6443" }, "is not HOST:PORT"},
	}
	for name, tt := range tests {
		t.Run(name, func(t *testing.T) {
			s := good
			tt.change(&s)
			err := s.Validate(onlyV1363)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("Validate: %v; want an error saying %q", err, tt.want)
			}
		})
	}
}

func TestCheckEndpoint(t *testing.T) {
	for _, ok := range []string{"10.42.0.2:6443", "api.example.org:443", "[fd00::2]:6443"} {
		if err := CheckEndpoint(ok); err != nil {
			t.Errorf("CheckEndpoint(%q): %v", ok, err)
		}
	}
}

func TestValidateNamesEveryProblem(t *testing.T) {
	err := Settings{KubernetesVersion: "banana", ClusterName: "Bad_Name", ServiceCIDR: "garbage"}.Validate(onlyV1363)
	for _, want := range []string{"v1.36.3 only", "Bad_Name", "garbage"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Validate: %v; want it to name %q", err, want)
		}
	}
}

func TestQuote(t *testing.T) {
	tests := map[string]struct {
		in   string
		want string
	}{
		"short":             {"demo", `"demo"`},
		"at the bound":      {strings.Repeat("a", maxQuoted), `"` + strings.Repeat("a", maxQuoted) + `"`},
		"over the bound":    {strings.Repeat("a", 3<<20), `"` + strings.Repeat("a", maxQuoted) + `"... (3145728 bytes)`},
		"cut inside a rune": {strings.Repeat("a", maxQuoted-1) + "€", `"` + strings.Repeat("a", maxQuoted-1) + `\xe2"... (66 bytes)`},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			if got := Quote(tc.in); got != tc.want {
				t.Fatalf("Quote = %s, want %s", got, tc.want)
			}
		})
	}
}
