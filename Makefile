# Orrery's build. 'make test' is the test command (CI runs it through
# .ci/run); 'make help' lists the targets. Every target first runs
# 'make deps', which installs what is missing, so a fresh Debian 12 machine
# needs nothing else.

SHELL := /bin/bash
.SHELLFLAGS := -euo pipefail -c
export PATH := $(PATH):/usr/local/go/bin
GO ?= go
BIN := build/bin
TOOLS := build/tools
# How long each fuzz target runs: short in 'make test', longer on demand
# ('make fuzz FUZZTIME=10m').
FUZZTIME ?= 10s
# How long 'make e2e' may run before it fails and keeps its logs; a loaded
# host needs longer (hack/stress-e2e.sh). Machines of the same kind differ:
# the suite took 26 min on a fast one, while on one whose TCG guests ran
# 2.6 times slower every phase up to the late joiners took 83 min, the
# whole about 110 (docs/performance.md).
E2E_TIMEOUT ?= 120m
# How many times longer than on an idle host the suite waits for each step
# of the cluster: 2 when another process keeps a core busy (with one host
# core kept busy, a worker was Ready 14-19 min after its join ticket, past
# the suite's 15). The phase table shows what each step took either way.
E2E_SLOWDOWN ?= 1
# The smoke run's deadline: 38 min of suite time here with the 6.12 kernel
# under QEMU 10 (20 min with 6.1 under QEMU 7.2), more on a slow host, and
# room for its teardown.
E2E_SMOKE_TIMEOUT ?= 60m
# The Kubernetes upgrade run's deadline: 25-31 min of suite time here,
# and room for a slower host and the teardown.
E2E_KUBERNETES_UPGRADE_TIMEOUT ?= 90m
E2E_HA_TIMEOUT ?= 120m
# 'make idle-cost': how many workers beside the control plane, how long
# the measured window is, and how long the cluster is then watched for
# staying up (0: not watched; the lighter-node target is an hour).
IDLE_WORKERS ?= 0
IDLE_WINDOW ?= 10m
IDLE_WATCH ?= 0
IDLE_TIMEOUT ?= 240m
# A folder for CPU profiles of the API server and the kubelets, taken in
# the window's middle (empty: none).
IDLE_PROFILE ?=

.PHONY: help all deps packages pin-packages build test testbin unit fuzz lint proto proto-check bench clean components initrd image boot-test e2e e2e-smoke e2e-kubernetes-upgrade e2e-ha idle-cost cluster

help: ## list the targets
	@grep -E '^[a-z0-9-]+:.*## ' $(MAKEFILE_LIST) | sed -E 's/:.*## /\t/' | expand -t 14

all: build

deps: ## install missing Debian packages and pinned Go tools (idempotent)
	@hack/deps.sh

packages: deps ## fetch the node's pinned kernel and systemd-stub into build/packages, checked against image/packages/packages.lock
	@image/packages/fetch.sh

pin-packages: deps ## pin the Debian archive's current kernel, systemd-stub and OS tree packages in image/packages/packages.lock (the image's measurements change)
	@hack/pin-packages.sh

# The programs: directory -> binary name.
PROGRAMS := cli:orrery bootstrapperd:bootstrapperd inspectd:orrery-inspectd joinservice:joinservice

build: deps ## build every program into build/bin/
	@mkdir -p $(BIN)
	@for p in $(PROGRAMS); do \
		dir=$${p%%:*}; name=$${p##*:}; \
		[[ -n $$(ls $$dir/*.go 2>/dev/null) ]] || continue; \
		echo "build $(BIN)/$$name"; \
		CGO_ENABLED=0 $(GO) build -trimpath -o $(BIN)/$$name ./$$dir; \
	done

test: deps proto-check build unit ## all tests that need no OS image: unit tests, then a short run of every fuzz target
	@$(MAKE) --no-print-directory fuzz FUZZTIME=$(FUZZTIME)

testbin: deps ## etcd, kube-apiserver, kube-controller-manager and kubeadm for the tests that run a real API server (into build/components)
	ORRERY_COMPONENTS_ONLY=testbin image/components/build.sh build/components

# The initrd's VM tests run after the rest, alone: beside the other
# packages' race-enabled builds and VMs, a guest kernel once stalled before
# /init for the test's whole 6 minutes (a cold CI build on 2 cores).
VMTEST = ./initrd/internal/vmtest

unit: deps testbin packages ## go test with the race detector (TPM tests run against swtpm), also in the components' own modules
	$(GO) test -race -count=1 $$($(GO) list ./... | grep -vx 'github.com/orrery-dev/orrery/initrd/internal/vmtest')
	$(GO) test -race -count=1 $(VMTEST)
	cd image/components && $(GO) test -count=1 ./...
	cd image/components/containerd && $(GO) test -count=1 ./cmd/... ./nodeconfig/
	cd image/components/cni && $(GO) test -count=1 ./cmd/...

fuzz: deps ## run every fuzz target for FUZZTIME each (hack/fuzz.sh)
	GO=$(GO) hack/fuzz.sh $(FUZZTIME)

bench: deps ## benchmarks: attestation issue/verify, attested TLS handshake + RPC
	$(GO) test -run='^$$' -bench=. -benchmem ./internal/...

lint: deps ## gofmt, go vet, staticcheck and golangci-lint (.golangci.yml)
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [[ -n $$out ]]; then echo "gofmt needed on:"; echo "$$out"; exit 1; fi
	$(GO) vet ./...
	$(GO) vet -tags e2e ./e2e
	$(TOOLS)/staticcheck ./...
	$(TOOLS)/staticcheck -tags e2e ./e2e
	$(TOOLS)/golangci-lint run ./...

proto: deps ## regenerate the protobuf code with the pinned tools
	hack/proto.sh gen

proto-check: deps ## fail if the generated protobuf code is stale
	hack/proto.sh check

components: deps ## build Kubernetes, containerd, runc, CNI and container images from Go modules into build/components/
	image/components/build.sh build/components

initrd: deps ## build the node's initrd into build/initrd/
	initrd/build.sh build/initrd

image: deps components ## build the node's OS image and its predicted measurements into build/image/ (DEBUG=1: debug variant; TRUST=old/measurements.json: trust that image's join services)
	image/build.sh build/image

boot-test: ## boot build/image under OVMF + swtpm and check PCRs, state disk and bootstrapperd
	image/boot-test.sh build/image

cluster: deps image build ## bring up a local cluster of simulated SEV-SNP VMs: orrery mini up, then orrery init (root; 50-65 min the first time, 10-15 later)
	build/bin/orrery mini up --sev-snp
	build/bin/orrery init --replace-workspace --measurements build/image/measurements-sev-snp.json --snp-test-root orrery-mini/snp-test-root.json
	@echo "kubectl: build/components/hostbin/kubectl --kubeconfig orrery-admin.conf get nodes"

E2E_ARGS = -image-dir $(CURDIR)/build/image \
		-orrery $(CURDIR)/build/bin/orrery -kubectl $(CURDIR)/build/components/hostbin/kubectl \
		-helm $(CURDIR)/build/components/hostbin/helm -logs-dir $(CURDIR)/build/e2e-logs \
		-slowdown $(E2E_SLOWDOWN)

e2e: deps image build ## end to end: the whole flow on the local cloud (root, 25-110 min under TCG; E2E_TIMEOUT=120m)
	$(GO) test -tags e2e -count=1 -timeout $(E2E_TIMEOUT) -v ./e2e -args $(E2E_ARGS)

e2e-smoke: deps image build ## the end-to-end suite's core: init, join, a Service across nodes, a modified image refused (root, 20-40 min of suite; CI runs it)
	$(GO) test -tags e2e -count=1 -timeout $(E2E_SMOKE_TIMEOUT) -v ./e2e -args $(E2E_ARGS) -set smoke

e2e-kubernetes-upgrade: deps image build ## a cluster at the image's older Kubernetes upgraded in place to its newer one while it serves (root, 25-31 min of suite)
	$(GO) test -tags e2e -count=1 -timeout $(E2E_KUBERNETES_UPGRADE_TIMEOUT) -v ./e2e -args $(E2E_ARGS) -set kubernetes-upgrade

e2e-ha: deps image build ## three control planes behind the cloud's load balancer: two join once approved, one is hard-reset while the cluster serves, one is removed (root)
	$(GO) test -tags e2e -count=1 -timeout $(E2E_HA_TIMEOUT) -v ./e2e -args $(E2E_ARGS) -set ha

idle-cost: deps image build ## what an idle cluster costs: host cores per VM, the guests' CPU per process and cgroup, switches, journal, memory (root; IDLE_WORKERS=1, IDLE_WINDOW=10m, IDLE_WATCH=60m)
	$(GO) test -tags e2e -count=1 -timeout $(IDLE_TIMEOUT) -v -run TestCluster ./e2e -args $(E2E_ARGS) -set idle \
		-idle-workers $(IDLE_WORKERS) -idle-window $(IDLE_WINDOW) -idle-watch $(IDLE_WATCH) -idle-profile "$(if $(IDLE_PROFILE),$(abspath $(IDLE_PROFILE)))"

clean: ## remove build outputs
	rm -rf build
