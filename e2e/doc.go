// Package e2e holds the end-to-end suite (build tag e2e, run by 'make
// e2e'): it boots a control plane and a worker from the built image on
// the local cloud, initialises the cluster with orrery init, and checks
// that the worker joins by itself and that pods reach each other's
// Services across nodes, then reboots, recovery, upgrades, removal and
// refused images. With -set smoke ('make e2e-smoke', CI) it stops after a
// node from a modified image is refused; -set kubernetes-upgrade ('make
// e2e-kubernetes-upgrade') makes a cluster at the image's older
// Kubernetes and upgrades it in place while it serves.
package e2e
