// Package vmtest boots Debian's cloud kernel with the node's initrd under
// QEMU (with a swtpm vTPM, a small dm-verity root disk and a blank state
// disk) and checks from outside what the initrd did. Its tests need root,
// QEMU, swtpm, cryptsetup and erofs-utils, and skip without them.
package vmtest
