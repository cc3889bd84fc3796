// Package childproc starts child processes that must not outlive this one
// (SysProcAttr.Pdeathsig) and must not die before it either.
//
// Linux sends the parent-death signal when the thread that forked the
// child exits, not when the process does. The Go runtime ends a thread
// when a goroutine locked to it returns without unlocking, as network
// namespace helpers do on purpose (internal/cloud/netenv's Network.Do):
// if the thread had earlier forked a VM's QEMU or an swtpm, that child got
// its death signal in the middle of a run. Start forks from a goroutine
// that keeps its thread locked until the child has exited, so the thread
// lives exactly as long as the child.
package childproc

import (
	"os/exec"
	"runtime"
)

// Start starts cmd and returns a channel that receives the result of
// cmd.Wait once the child has exited. Callers must not call cmd.Wait
// themselves.
func Start(cmd *exec.Cmd) (<-chan error, error) {
	started := make(chan error, 1)
	exited := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		if err := cmd.Start(); err != nil {
			started <- err
			return
		}
		started <- nil
		exited <- cmd.Wait()
	}()
	if err := <-started; err != nil {
		return nil, err
	}
	return exited, nil
}
