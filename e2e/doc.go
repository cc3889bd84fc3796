// Package e2e holds the end-to-end suite (build tag e2e, run by 'make
// e2e'): it boots a control plane and a worker from the built image on
// the local cloud, initialises the cluster with orrery init, and checks
// that the worker joins by itself and that pods reach each other's
// Services across nodes.
package e2e
