module github.com/orrery-dev/orrery/image/components

go 1.26.0

// This module holds only the build tooling (containerimage) and Orrery's own small
// programs (pause). Each upstream project is pinned in a module of its own
// beside it (kubernetes/, containerd/, runc/, cni/, flannel/, etcd/, coredns/),
// so that each is built with its own dependency versions and no minimal
// version selection across projects changes what upstream tested.

require github.com/google/go-containerregistry v0.22.1

require (
	github.com/klauspost/compress v1.19.2 // indirect
	github.com/opencontainers/go-digest v1.0.0 // indirect
	github.com/opencontainers/image-spec v1.1.1 // indirect
)
