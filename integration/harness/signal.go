package harness

import (
	"os"
	"os/signal"
	"sync"
	"syscall"
)

// CloseOnSignal closes the clusters on SIGINT or SIGTERM and then lets the
// signal take its default effect (the process ends as if unhandled), so an
// interrupted demo leaves no JVM behind. The returned stop uninstalls the
// handler; callers that run until a signal may ignore it.
func CloseOnSignal(clusters ...*Cluster) (stop func()) {
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM)
	done := make(chan struct{})
	go func() {
		select {
		case sig := <-sigs:
			for _, c := range clusters {
				_ = c.Close()
			}
			signal.Reset(sig)
			_ = syscall.Kill(os.Getpid(), sig.(syscall.Signal))
		case <-done:
		}
	}()
	return sync.OnceFunc(func() {
		signal.Stop(sigs)
		close(done)
	})
}
