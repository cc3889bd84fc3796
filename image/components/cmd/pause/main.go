// Command pause is the process that holds a pod sandbox's namespaces open.
// It is PID 1 of the sandbox: it reaps every child that is re-parented to it
// and exits cleanly on SIGINT or SIGTERM. It never reads input and never
// writes anything except on a signal it cannot handle.
package main

import (
	"fmt"
	"os"
	"os/signal"
	"syscall"
)

// version is printed by -v; build.sh sets it with -ldflags -X.
var version = "dev"

func main() {
	if len(os.Args) > 1 && (os.Args[1] == "-v" || os.Args[1] == "--version") {
		fmt.Println("pause", version)
		return
	}
	os.Exit(run())
}

// run blocks until SIGINT or SIGTERM and returns the exit code.
func run() int {
	sigs := make(chan os.Signal, 8)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM, syscall.SIGCHLD)
	for sig := range sigs {
		switch sig {
		case syscall.SIGCHLD:
			reap()
		default:
			return 0
		}
	}
	return 0
}

// reap collects every child that has exited, without blocking.
func reap() {
	for {
		var status syscall.WaitStatus
		pid, err := syscall.Wait4(-1, &status, syscall.WNOHANG, nil)
		if err == syscall.EINTR {
			continue
		}
		if pid <= 0 || err != nil {
			return
		}
	}
}
