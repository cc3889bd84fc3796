// Package e2e holds the end-to-end suite (build tag e2e, run by 'make
// e2e'): it boots a control plane and a worker from the built image on
// the local cloud, initialises the cluster with orrery init, and checks
// that the worker joins by itself and that pods reach each other's
// Services across nodes, then reboots, recovery, upgrades, removal and
// refused images. With -smoke ('make e2e-smoke', CI) it stops after a
// node from a modified image is refused.
package e2e
