// Command pause is the pod sandbox's process, as Kubernetes' own pause image runs: it holds the
// Pod's namespaces open, reaps the children it inherits, and exits on SIGINT or SIGTERM. Built
// here (statically) so the test node needs no image registry.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	signals := make(chan os.Signal, 1)
	signal.Notify(signals, syscall.SIGINT, syscall.SIGTERM, syscall.SIGCHLD)
	for s := range signals {
		if s != syscall.SIGCHLD {
			os.Exit(0)
		}
		for {
			pid, err := syscall.Wait4(-1, nil, syscall.WNOHANG, nil)
			if pid <= 0 || err != nil {
				break
			}
		}
	}
}
