// Package metadataserver is the local cloud's metadata API server, the
// harness's stand-in for a cloud's metadata service (the wire format and
// the client nodes use are in internal/metadata). Like a cloud's, it knows
// its callers by their source address: a request from an address that is
// not one of the configured VMs gets 404. Its endpoints are described in
// internal/metadata.
package metadataserver

import (
	"cmp"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/netip"
	"slices"
	"strings"

	"golang.org/x/crypto/bcrypt"

	"github.com/orrery-dev/orrery/internal/clusternet"
	"github.com/orrery-dev/orrery/internal/metadata"
	"github.com/orrery-dev/orrery/internal/role"
)

// errNoControlPlane means there is no endpoint to hand out.
var errNoControlPlane = errors.New("no control-plane instance: add at least one with role " + string(role.ControlPlane))

// maxRequestBody is how much of a request body the handler reads to tell
// an empty body from a non-empty one; larger ones are refused unread.
const maxRequestBody = 4 << 10

// Config configures the handler.
type Config struct {
	// Instances are the VMs; at least one must be a control-plane.
	Instances []metadata.Instance
	// InitSecretHash is the bcrypt hash of the init secret.
	InitSecretHash []byte
	// APIServerPort is the control plane's API server port. Zero means
	// clusternet.APIServerPort.
	APIServerPort int
	// Endpoint is the control planes' stable endpoint, a load balancer
	// in front of them; zero means the first control plane's API server
	// (at APIServerPort).
	Endpoint netip.AddrPort
	// Logger receives a line per request; nil discards them.
	Logger *slog.Logger
	// SEVSNPReport plays the simulated AMD Secure Processor of the
	// instances whose TEE is metadata.TEESimulatedSEVSNP: it returns an
	// extended report for the named instance. Required if any instance
	// has that TEE.
	SEVSNPReport func(instance string, reportData [64]byte) ([]byte, error)
}

// handler serves the API. Every answer is encoded up front, so serving
// cannot fail.
type handler struct {
	self     map[netip.Addr][]byte // /self answer by caller address
	names    map[netip.Addr]string // for the log
	peers    []byte
	endpoint []byte
	hash     []byte
	tee      map[netip.Addr]string
	report   func(instance string, reportData [64]byte) ([]byte, error)
	log      *slog.Logger
}

// NewHandler checks cfg (valid and unique names and addresses, valid
// roles, at least one control-plane, a bcrypt hash, a valid port) and
// returns the API's handler. The control-plane endpoint is cfg.Endpoint,
// or else the first control-plane instance in cfg.Instances.
func NewHandler(cfg Config) (http.Handler, error) {
	if err := metadata.CheckInstances(cfg.Instances); err != nil {
		return nil, err
	}
	if _, err := bcrypt.Cost(cfg.InitSecretHash); err != nil {
		return nil, fmt.Errorf("init secret hash is not a bcrypt hash (%w): pass the output of bcrypt.GenerateFromPassword", err)
	}
	port := cmp.Or(cfg.APIServerPort, clusternet.APIServerPort)
	if port < 1 || port > 65535 {
		return nil, fmt.Errorf("invalid API server port %d: want 1-65535", cfg.APIServerPort)
	}
	cp := slices.IndexFunc(cfg.Instances, func(in metadata.Instance) bool { return in.Role == role.ControlPlane })
	if cp < 0 {
		return nil, errNoControlPlane
	}
	h := &handler{
		self:   make(map[netip.Addr][]byte, len(cfg.Instances)),
		names:  make(map[netip.Addr]string, len(cfg.Instances)),
		tee:    make(map[netip.Addr]string, len(cfg.Instances)),
		report: cfg.SEVSNPReport,
		log:    cfg.Logger,
	}
	if h.log == nil {
		h.log = slog.New(slog.DiscardHandler)
	}
	for _, in := range cfg.Instances {
		h.self[in.IP] = mustJSON(in)
		h.names[in.IP] = in.Name
		h.tee[in.IP] = in.TEE
		if in.TEE == metadata.TEESimulatedSEVSNP && cfg.SEVSNPReport == nil {
			return nil, fmt.Errorf("instance %s is a simulated SEV-SNP VM, but no SEVSNPReport signs its reports", in.Name)
		}
	}
	peers := slices.Clone(cfg.Instances)
	slices.SortFunc(peers, func(a, b metadata.Instance) int {
		return cmp.Or(cmp.Compare(a.Role, b.Role), cmp.Compare(a.Name, b.Name))
	})
	h.peers = mustJSON(peers)
	endpoint := netip.AddrPortFrom(cfg.Instances[cp].IP, uint16(port))
	if cfg.Endpoint.IsValid() {
		endpoint = cfg.Endpoint
	}
	h.endpoint = mustJSON(metadata.EndpointAnswer{Endpoint: endpoint.String()})
	h.hash = mustJSON(metadata.InitSecretHashAnswer{Hash: string(cfg.InitSecretHash)})
	return h, nil
}

// mustJSON encodes values whose encoding cannot fail (no channels, funcs
// or cyclic data).
func mustJSON(v any) []byte {
	b, err := json.Marshal(v)
	if err != nil {
		panic(fmt.Sprintf("metadataserver: encode %T: %v", v, err))
	}
	return append(b, '\n')
}

func (h *handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	log := h.log.With("method", r.Method, "path", r.URL.Path, "remote", r.RemoteAddr)
	switch r.URL.Path {
	case metadata.PathSelf, metadata.PathPeers, metadata.PathEndpoint, metadata.PathInitSecretHash:
	default:
		if strings.HasPrefix(r.URL.Path, metadata.PathSEVSNPReport) {
			break
		}
		h.fail(w, log, http.StatusNotFound, "no such endpoint")
		return
	}
	if r.Method != http.MethodGet {
		w.Header().Set("Allow", http.MethodGet)
		h.fail(w, log, http.StatusMethodNotAllowed, "only GET is allowed")
		return
	}
	if r.URL.RawQuery != "" || r.URL.ForceQuery {
		h.fail(w, log, http.StatusBadRequest, "endpoints take no query")
		return
	}
	if status, msg := checkNoBody(w, r); status != 0 {
		h.fail(w, log, status, msg)
		return
	}
	addr, err := netip.ParseAddrPort(r.RemoteAddr)
	if err != nil {
		// net/http always sets ip:port; anything else means a listener
		// or proxy in front that hides who calls, so nobody is known.
		log.Error("cannot tell the caller's address", "error", err)
		h.fail(w, log, http.StatusNotFound, "unknown caller")
		return
	}
	// A dual-stack listener reports IPv4 callers as ::ffff:a.b.c.d.
	caller := addr.Addr().Unmap()
	self, ok := h.self[caller]
	if !ok {
		log.Warn("metadata request from unknown caller")
		h.fail(w, log, http.StatusNotFound, "unknown caller")
		return
	}
	var body []byte
	switch r.URL.Path {
	default:
		var status int
		if body, status = h.sevSNPReport(log, caller, strings.TrimPrefix(r.URL.Path, metadata.PathSEVSNPReport)); status != http.StatusOK {
			h.fail(w, log, status, string(body))
			return
		}
	case metadata.PathSelf:
		body = self
	case metadata.PathPeers:
		body = h.peers
	case metadata.PathEndpoint:
		body = h.endpoint
	case metadata.PathInitSecretHash:
		body = h.hash
	}
	log.Debug("metadata request served", "instance", h.names[caller])
	writeJSON(w, http.StatusOK, body)
}

// sevSNPReport answers a simulated SEV-SNP VM's report request; on
// failure it returns the message and a status other than 200.
func (h *handler) sevSNPReport(log *slog.Logger, caller netip.Addr, dataHex string) ([]byte, int) {
	if h.tee[caller] != metadata.TEESimulatedSEVSNP {
		return []byte("this VM is not a simulated SEV-SNP VM: it has no AMD Secure Processor to ask"), http.StatusNotFound
	}
	var data [64]byte
	if raw, err := hex.DecodeString(dataHex); err != nil || len(raw) != len(data) {
		return []byte("the report data must be 128 hex digits"), http.StatusBadRequest
	} else {
		copy(data[:], raw)
	}
	report, err := h.report(h.names[caller], data)
	if err != nil {
		log.Error("simulated SEV-SNP report failed", "instance", h.names[caller], "error", err.Error())
		return []byte("the simulated AMD Secure Processor failed: see the local cloud's log"), http.StatusInternalServerError
	}
	return mustJSON(metadata.SEVSNPReportAnswer{Report: report}), http.StatusOK
}

// checkNoBody returns a status and message if r has a body.
func checkNoBody(w http.ResponseWriter, r *http.Request) (int, string) {
	if r.ContentLength > maxRequestBody {
		return http.StatusRequestEntityTooLarge, "request body too large; endpoints take no body"
	}
	// A chunked body has no length up front: read a bounded part of it.
	n, err := io.Copy(io.Discard, http.MaxBytesReader(w, r.Body, maxRequestBody))
	var tooLarge *http.MaxBytesError
	switch {
	case errors.As(err, &tooLarge):
		return http.StatusRequestEntityTooLarge, "request body too large; endpoints take no body"
	case err != nil:
		return http.StatusBadRequest, "cannot read request body"
	case n > 0:
		return http.StatusBadRequest, "endpoints take no body"
	}
	return 0, ""
}

func (h *handler) fail(w http.ResponseWriter, log *slog.Logger, status int, msg string) {
	log.Debug("metadata request refused", "status", status, "reason", msg)
	writeJSON(w, status, mustJSON(metadata.ErrorAnswer{Error: msg}))
}

func writeJSON(w http.ResponseWriter, status int, body []byte) {
	hdr := w.Header()
	hdr.Set("Content-Type", "application/json")
	hdr.Set("X-Content-Type-Options", "nosniff")
	// Answers depend on the caller, so no cache may share them.
	hdr.Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	_, _ = w.Write(body) // a VM that hung up
}
