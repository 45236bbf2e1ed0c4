// Command pause is the pod sandbox's process for the real node of the local cluster: it holds the
// pod's namespaces and exits on SIGINT or SIGTERM. Built static (CGO_ENABLED=0) into an image
// FROM scratch and named as containerd's sandbox_image, because registry.k8s.io/pause cannot be
// pulled here. As PID 1 of the pod it also reaps orphans, like the upstream C pause.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	signals := make(chan os.Signal, 4)
	signal.Notify(signals, syscall.SIGINT, syscall.SIGTERM, syscall.SIGCHLD)
	for received := range signals {
		if received == syscall.SIGCHLD {
			for {
				var status syscall.WaitStatus
				pid, err := syscall.Wait4(-1, &status, syscall.WNOHANG, nil)
				if pid <= 0 || err != nil {
					break
				}
			}
			continue
		}
		os.Exit(0)
	}
}
