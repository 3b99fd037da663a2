package main

import (
	"errors"
	"fmt"
	"os"
	"runtime/pprof"

	"github.com/urfave/cli/v2"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/kmirror/kmirror/daemon"
	"github.com/kmirror/kmirror/daemon/api"
	"github.com/kmirror/kmirror/daemon/config"
)

func daemonCommand() *cli.Command {
	return &cli.Command{
		Name:  "daemon",
		Usage: "run a kmirror member until SIGINT or SIGTERM",
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "config", Usage: "YAML config `FILE` (required; see deploy/kmirror.example.yaml)"},
			&cli.StringFlag{Name: "cpu-profile", Usage: "write a Go CPU profile of the whole run to `FILE` (diagnostics: read it with go tool pprof)"},
		},
		Action: func(c *cli.Context) error {
			if err := checkInvocation(c, "config"); err != nil {
				return err
			}
			cfg, err := config.Load(c.String("config"))
			if err != nil {
				return usageError{err}
			}
			logger, err := newLogger(cfg.LogLevel)
			if err != nil {
				return err
			}
			// Sync fails on some terminals and pipes; there is nothing to do then.
			defer func() { _ = logger.Sync() }()
			logger.Info("starting kmirror member",
				zap.String("version", version),
				zap.String("node_id", cfg.NodeID),
				zap.String("http_listen", cfg.HTTPListen),
				zap.String("raft_advertise", cfg.RaftAdvertise))
			if path := c.String("cpu-profile"); path != "" {
				stop, err := startCPUProfile(path)
				if err != nil {
					return usageError{err}
				}
				defer stop()
			}
			err = daemon.Run(c.Context, cfg, logger)
			if errors.Is(err, api.ErrRefused) {
				return usageError{err} // exit 2: a restart cannot help
			}
			return err
		},
	}
}

// startCPUProfile starts a CPU profile into path; stop ends it and closes
// the file.
func startCPUProfile(path string) (stop func(), err error) {
	f, err := os.Create(path)
	if err != nil {
		return nil, fmt.Errorf("--cpu-profile: %w", err)
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		f.Close()
		return nil, fmt.Errorf("--cpu-profile %s: %w", path, err)
	}
	return func() {
		pprof.StopCPUProfile()
		f.Close()
	}, nil
}

// newLogger writes JSON lines to stderr (journald keeps them) at level.
// Sampling is off: a divergence or data-loss error must never be dropped.
func newLogger(level string) (*zap.Logger, error) {
	lvl, err := zapcore.ParseLevel(level)
	if err != nil {
		return nil, fmt.Errorf("log_level: %w", err)
	}
	zc := zap.NewProductionConfig()
	zc.Level = zap.NewAtomicLevelAt(lvl)
	zc.Sampling = nil
	zc.EncoderConfig.TimeKey = "time"
	zc.EncoderConfig.EncodeTime = zapcore.ISO8601TimeEncoder
	// Stack traces only for panics: raft logs an error on every failed
	// heartbeat while a peer is down, and a trace on each says nothing.
	zc.DisableStacktrace = true
	logger, err := zc.Build()
	if err != nil {
		return nil, fmt.Errorf("build logger: %w", err)
	}
	return logger, nil
}
