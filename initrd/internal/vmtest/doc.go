// Package vmtest boots Debian's cloud kernel with the node's initrd under
// QEMU (with a swtpm vTPM, a small dm-verity root disk and a blank state
// disk) and checks from outside what the initrd did. Its VM tests need
// root, QEMU, swtpm, cryptsetup and erofs-utils, and skip without them or
// with -short. A state disk keyed to a cluster is the one a first boot
// formatted, re-keyed on the host as bootstrapperd re-keys it (the host
// cannot format dm-integrity); TestRekeyOnTheHost checks that re-keying
// without a VM.
package vmtest
