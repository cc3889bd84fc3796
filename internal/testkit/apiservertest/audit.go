package apiservertest

import (
	"bufio"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"
)

// auditPolicy logs, at metadata level, only the requests the API server
// makes to itself (its loopback client's user): what it looks up while it
// admits a request, which SelfRequests lets a test count.
const auditPolicy = `apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: ["RequestReceived"]
rules:
  - level: Metadata
    users: ["system:apiserver"]
  - level: None
`

// SelfRequest is one request the API server made to itself.
type SelfRequest struct {
	Verb      string `json:"verb"`
	ObjectRef struct {
		Resource  string `json:"resource"`
		Namespace string `json:"namespace"`
		Name      string `json:"name"`
	} `json:"objectRef"`
}

// auditArgs are the flags that make the API server log its requests to
// itself into dir.
func auditArgs(tb testing.TB, dir string) []string {
	tb.Helper()
	policy := filepath.Join(dir, "audit-policy.yaml")
	if err := os.WriteFile(policy, []byte(auditPolicy), 0o600); err != nil {
		tb.Fatal(err)
	}
	return []string{"--audit-policy-file=" + policy, "--audit-log-path=" + filepath.Join(dir, auditLog), "--audit-log-format=json"}
}

const auditLog = "self-requests.log"

// SelfRequests returns the requests the API server has made to itself so
// far, oldest first. The log backend writes each before the request's
// answer leaves the server.
func (s *Server) SelfRequests(tb testing.TB) []SelfRequest {
	tb.Helper()
	f, err := os.Open(filepath.Join(s.dir, auditLog))
	if os.IsNotExist(err) {
		return nil
	}
	if err != nil {
		tb.Fatal(err)
	}
	defer f.Close()
	var out []SelfRequest
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for sc.Scan() {
		var r SelfRequest
		if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
			tb.Fatalf("audit log: %v", err)
		}
		out = append(out, r)
	}
	if err := sc.Err(); err != nil {
		tb.Fatal(err)
	}
	return out
}
