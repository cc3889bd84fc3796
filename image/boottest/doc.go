// Package boottest holds the image boot test (build tag boottest): it
// boots build/image on the local cloud and checks PCRs, attestation, the
// state disk and bootstrapperd from outside. See image/boot-test.sh.
package boottest
