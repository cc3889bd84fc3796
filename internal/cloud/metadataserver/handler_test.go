package metadataserver

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"testing"

	"golang.org/x/crypto/bcrypt"

	"github.com/orrery-dev/orrery/internal/metadata"
	"github.com/orrery-dev/orrery/internal/role"
)

var testHash = sync.OnceValue(func() []byte {
	h, err := bcrypt.GenerateFromPassword([]byte("init secret"), bcrypt.MinCost)
	if err != nil {
		panic(err)
	}
	return h
})

var testInstances = []metadata.Instance{
	{Name: "worker-1", Role: role.Worker, IP: netip.MustParseAddr("10.42.0.12")},
	{Name: "cp-1", Role: role.ControlPlane, IP: netip.MustParseAddr("10.42.0.11")},
	{Name: "cp-0", Role: role.ControlPlane, IP: netip.MustParseAddr("10.42.0.10")},
	{Name: "worker-0", Role: role.Worker, IP: netip.MustParseAddr("10.42.0.13")},
}

func testHandler(t *testing.T) http.Handler {
	t.Helper()
	h, err := NewHandler(Config{Instances: testInstances, InitSecretHash: testHash()})
	if err != nil {
		t.Fatal(err)
	}
	return h
}

func TestNewHandlerValidate(t *testing.T) {
	tests := map[string]struct {
		change  func(*Config)
		wantErr bool
	}{
		"valid":                 {change: func(*Config) {}},
		"only a control plane":  {change: func(c *Config) { c.Instances = c.Instances[1:2] }},
		"IPv6 instance":         {change: func(c *Config) { c.Instances[0].IP = netip.MustParseAddr("fd00::12") }},
		"custom port":           {change: func(c *Config) { c.APIServerPort = 443 }},
		"dotted name":           {change: func(c *Config) { c.Instances[0].Name = "worker-1.orrery" }},
		"no instances":          {change: func(c *Config) { c.Instances = nil }, wantErr: true},
		"no control plane":      {change: func(c *Config) { c.Instances = c.Instances[:1] }, wantErr: true},
		"empty name":            {change: func(c *Config) { c.Instances[0].Name = "" }, wantErr: true},
		"uppercase name":        {change: func(c *Config) { c.Instances[0].Name = "Worker-1" }, wantErr: true},
		"name with slash":       {change: func(c *Config) { c.Instances[0].Name = "w/1" }, wantErr: true},
		"name ends in dash":     {change: func(c *Config) { c.Instances[0].Name = "w-" }, wantErr: true},
		"name too long":         {change: func(c *Config) { c.Instances[0].Name = strings.Repeat("a.", 127) + "a" }, wantErr: true},
		"duplicate name":        {change: func(c *Config) { c.Instances[0].Name = "cp-0" }, wantErr: true},
		"duplicate IP":          {change: func(c *Config) { c.Instances[0].IP = netip.MustParseAddr("10.42.0.10") }, wantErr: true},
		"unknown role":          {change: func(c *Config) { c.Instances[0].Role = "master" }, wantErr: true},
		"no IP":                 {change: func(c *Config) { c.Instances[0].IP = netip.Addr{} }, wantErr: true},
		"IPv4-mapped IPv6":      {change: func(c *Config) { c.Instances[0].IP = netip.MustParseAddr("::ffff:10.42.0.12") }, wantErr: true},
		"IP with zone":          {change: func(c *Config) { c.Instances[0].IP = netip.MustParseAddr("fe80::1%eth0") }, wantErr: true},
		"no hash":               {change: func(c *Config) { c.InitSecretHash = nil }, wantErr: true},
		"plain text secret":     {change: func(c *Config) { c.InitSecretHash = []byte("init secret") }, wantErr: true},
		"truncated hash":        {change: func(c *Config) { c.InitSecretHash = c.InitSecretHash[:40] }, wantErr: true},
		"negative port":         {change: func(c *Config) { c.APIServerPort = -1 }, wantErr: true},
		"port beyond 65535":     {change: func(c *Config) { c.APIServerPort = 65536 }, wantErr: true},
		"role with other case":  {change: func(c *Config) { c.Instances[1].Role = "Control-Plane" }, wantErr: true},
		"name with a space":     {change: func(c *Config) { c.Instances[0].Name = "worker 1" }, wantErr: true},
		"label of 64 bytes":     {change: func(c *Config) { c.Instances[0].Name = strings.Repeat("a", 64) }, wantErr: true},
		"name with empty label": {change: func(c *Config) { c.Instances[0].Name = "a..b" }, wantErr: true},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			cfg := Config{Instances: slices.Clone(testInstances), InitSecretHash: testHash()}
			tc.change(&cfg)
			_, err := NewHandler(cfg)
			if (err != nil) != tc.wantErr {
				t.Fatalf("NewHandler() = %v, wantErr %v", err, tc.wantErr)
			}
		})
	}
}

// checkJSONHeaders checks the headers every answer carries.
func checkJSONHeaders(t *testing.T, rec *httptest.ResponseRecorder) {
	t.Helper()
	for k, want := range map[string]string{
		"Content-Type":           "application/json",
		"Cache-Control":          "no-store",
		"X-Content-Type-Options": "nosniff",
	} {
		if got := rec.Header().Get(k); got != want {
			t.Errorf("%s = %q, want %q", k, got, want)
		}
	}
}

func TestHandlerRefuses(t *testing.T) {
	h := testHandler(t)
	const known = "10.42.0.10:40000"
	tests := map[string]struct {
		method     string
		target     string
		remote     string
		noRemote   bool // RemoteAddr empty rather than a known caller
		body       string
		chunked    bool
		wantStatus int
		wantError  string
	}{
		"unknown path":          {target: "/meta-data", wantStatus: 404, wantError: "no such endpoint"},
		"root":                  {target: "/", wantStatus: 404, wantError: "no such endpoint"},
		"trailing slash":        {target: "/self/", wantStatus: 404, wantError: "no such endpoint"},
		"other case":            {target: "/Self", wantStatus: 404, wantError: "no such endpoint"},
		"POST":                  {method: "POST", target: "/self", wantStatus: 405, wantError: "only GET is allowed"},
		"PUT":                   {method: "PUT", target: "/peers", wantStatus: 405, wantError: "only GET is allowed"},
		"HEAD":                  {method: "HEAD", target: "/endpoint", wantStatus: 405, wantError: "only GET is allowed"},
		"DELETE":                {method: "DELETE", target: "/initsecrethash", wantStatus: 405, wantError: "only GET is allowed"},
		"query":                 {target: "/self?name=cp-1", wantStatus: 400, wantError: "endpoints take no query"},
		"empty query":           {target: "/peers?", wantStatus: 400, wantError: "endpoints take no query"},
		"body":                  {target: "/self", body: "{}", wantStatus: 400, wantError: "endpoints take no body"},
		"chunked body":          {target: "/self", body: "{}", chunked: true, wantStatus: 400, wantError: "endpoints take no body"},
		"oversized body":        {target: "/self", body: strings.Repeat("x", maxRequestBody+1), wantStatus: 413, wantError: "request body too large; endpoints take no body"},
		"oversized chunked":     {target: "/self", body: strings.Repeat("x", maxRequestBody+1), chunked: true, wantStatus: 413, wantError: "request body too large; endpoints take no body"},
		"unknown caller":        {target: "/self", remote: "10.42.0.99:40000", wantStatus: 404, wantError: "unknown caller"},
		"unknown caller peers":  {target: "/peers", remote: "192.0.2.1:40000", wantStatus: 404, wantError: "unknown caller"},
		"unknown caller hash":   {target: "/initsecrethash", remote: "[fd00::10]:40000", wantStatus: 404, wantError: "unknown caller"},
		"loopback caller":       {target: "/endpoint", remote: "127.0.0.1:40000", wantStatus: 404, wantError: "unknown caller"},
		"RemoteAddr no port":    {target: "/self", remote: "10.42.0.10", wantStatus: 404, wantError: "unknown caller"},
		"RemoteAddr garbage":    {target: "/self", remote: "not an address", wantStatus: 404, wantError: "unknown caller"},
		"RemoteAddr empty":      {target: "/self", noRemote: true, wantStatus: 404, wantError: "unknown caller"},
		"RemoteAddr unix":       {target: "/self", remote: "@", wantStatus: 404, wantError: "unknown caller"},
		"RemoteAddr with zone":  {target: "/self", remote: "[fe80::1%eth0]:1", wantStatus: 404, wantError: "unknown caller"},
		"unknown path POST":     {method: "POST", target: "/nope", wantStatus: 404, wantError: "no such endpoint"},
		"known caller bad path": {target: "/self/../peers/x", wantStatus: 404, wantError: "no such endpoint"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			method := tc.method
			if method == "" {
				method = http.MethodGet
			}
			var body io.Reader
			if tc.body != "" {
				body = strings.NewReader(tc.body)
			}
			req := httptest.NewRequest(method, tc.target, body)
			if tc.chunked {
				req.ContentLength = -1
				req.TransferEncoding = []string{"chunked"}
			}
			switch {
			case tc.noRemote:
				req.RemoteAddr = ""
			case tc.remote != "":
				req.RemoteAddr = tc.remote
			default:
				req.RemoteAddr = known
			}
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, req)
			if rec.Code != tc.wantStatus {
				t.Errorf("status = %d, want %d", rec.Code, tc.wantStatus)
			}
			checkJSONHeaders(t, rec)
			var e metadata.ErrorAnswer
			if err := json.Unmarshal(rec.Body.Bytes(), &e); err != nil || e.Error != tc.wantError {
				t.Errorf("body = %q (%v), want error %q", rec.Body, err, tc.wantError)
			}
			if allow := rec.Header().Get("Allow"); (tc.wantStatus == 405) != (allow == "GET") {
				t.Errorf("Allow = %q", allow)
			}
		})
	}
}

func TestHandlerAnswers(t *testing.T) {
	h := testHandler(t)
	hash := string(testHash())
	peers := `[{"name":"cp-0","role":"control-plane","ip":"10.42.0.10"},` +
		`{"name":"cp-1","role":"control-plane","ip":"10.42.0.11"},` +
		`{"name":"worker-0","role":"worker","ip":"10.42.0.13"},` +
		`{"name":"worker-1","role":"worker","ip":"10.42.0.12"}]`
	tests := map[string]struct {
		remote, path, want string
	}{
		"self of cp-0":              {"10.42.0.10:1234", "/self", `{"name":"cp-0","role":"control-plane","ip":"10.42.0.10"}`},
		"self of worker-1":          {"10.42.0.12:1234", "/self", `{"name":"worker-1","role":"worker","ip":"10.42.0.12"}`},
		"self over dual-stack":      {"[::ffff:10.42.0.13]:1234", "/self", `{"name":"worker-0","role":"worker","ip":"10.42.0.13"}`},
		"peers from cp-1":           {"10.42.0.11:1", "/peers", peers},
		"peers from worker-0":       {"10.42.0.13:1", "/peers", peers},
		"endpoint is the first cp":  {"10.42.0.12:1", "/endpoint", `{"endpoint":"10.42.0.11:6443"}`},
		"init secret hash":          {"10.42.0.12:1", "/initsecrethash", `{"hash":"` + hash + `"}`},
		"escaped path is the same":  {"10.42.0.10:1234", "/%73elf", `{"name":"cp-0","role":"control-plane","ip":"10.42.0.10"}`},
		"init secret hash from cp0": {"10.42.0.10:1", "/initsecrethash", `{"hash":"` + hash + `"}`},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			req := httptest.NewRequest(http.MethodGet, tc.path, nil)
			req.RemoteAddr = tc.remote
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, req)
			if rec.Code != http.StatusOK {
				t.Fatalf("status = %d (%s), want 200", rec.Code, rec.Body)
			}
			checkJSONHeaders(t, rec)
			if got := strings.TrimSpace(rec.Body.String()); got != tc.want {
				t.Errorf("body = %s\nwant %s", got, tc.want)
			}
		})
	}
}

func TestHandlerEndpointFormat(t *testing.T) {
	tests := map[string]struct {
		ip       string
		port     int
		endpoint string
		want     string
	}{
		"IPv4 default port": {"10.42.0.10", 0, "", "10.42.0.10:6443"},
		"IPv4 custom port":  {"10.42.0.10", 443, "", "10.42.0.10:443"},
		"IPv6":              {"fd00::10", 0, "", "[fd00::10]:6443"},
		"load balancer":     {"10.42.0.10", 0, "10.42.0.2:6443", "10.42.0.2:6443"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			ip := netip.MustParseAddr(tc.ip)
			cfg := Config{
				Instances:      []metadata.Instance{{Name: "cp-0", Role: role.ControlPlane, IP: ip}},
				InitSecretHash: testHash(),
				APIServerPort:  tc.port,
			}
			if tc.endpoint != "" {
				cfg.Endpoint = netip.MustParseAddrPort(tc.endpoint)
			}
			h, err := NewHandler(cfg)
			if err != nil {
				t.Fatal(err)
			}
			req := httptest.NewRequest(http.MethodGet, "/endpoint", nil)
			req.RemoteAddr = netip.AddrPortFrom(ip, 5555).String()
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, req)
			var got metadata.EndpointAnswer
			if err := json.Unmarshal(rec.Body.Bytes(), &got); err != nil || got.Endpoint != tc.want {
				t.Errorf("body = %s (%v), want endpoint %s", rec.Body, err, tc.want)
			}
		})
	}
}

// A simulated SEV-SNP VM gets reports for itself only, and no other VM
// gets any: the simulated chip signs for the caller the source address
// names, with the data the caller chose.
func TestSEVSNPReport(t *testing.T) {
	instances := slices.Clone(testInstances)
	instances[2].TEE = metadata.TEESimulatedSEVSNP // cp-0
	var asked []string
	h, err := NewHandler(Config{Instances: instances, InitSecretHash: testHash(), SEVSNPReport: func(name string, data [64]byte) ([]byte, error) {
		asked = append(asked, name)
		return append([]byte("report for "+name+" "), data[:2]...), nil
	}})
	if err != nil {
		t.Fatal(err)
	}
	data := "0102" + strings.Repeat("00", 62)
	do := func(remote, target string) (int, string) {
		req := httptest.NewRequest(http.MethodGet, target, nil)
		req.RemoteAddr = remote
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		return rec.Code, rec.Body.String()
	}
	code, body := do("10.42.0.10:4000", metadata.PathSEVSNPReport+data)
	var a metadata.SEVSNPReportAnswer
	if code != 200 || json.Unmarshal([]byte(body), &a) != nil || string(a.Report) != "report for cp-0 \x01\x02" {
		t.Fatalf("simulated VM: %d %s", code, body)
	}
	if code, body := do("10.42.0.11:4000", metadata.PathSEVSNPReport+data); code != 404 || !strings.Contains(body, "not a simulated SEV-SNP VM") {
		t.Fatalf("a VM without the TEE: %d %s", code, body)
	}
	for _, bad := range []string{"zz", data + "00", data[:126], data + "/x"} {
		if code, _ := do("10.42.0.10:4000", metadata.PathSEVSNPReport+bad); code != 400 {
			t.Errorf("report data %q: status %d, want 400", bad, code)
		}
	}
	if len(asked) != 1 {
		t.Fatalf("the chip was asked %d times, want once: %v", len(asked), asked)
	}
	if _, err := NewHandler(Config{Instances: instances, InitSecretHash: testHash()}); err == nil {
		t.Fatal("a simulated SEV-SNP VM without a chip to sign its reports was accepted")
	}
}
