package raftstore

import (
	"fmt"
	"io"
	"log"

	"github.com/hashicorp/go-hclog"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// hclogAdapter lets hashicorp/raft log through the injected zap logger.
// Levels are owned by the zap core: SetLevel does nothing, and Trace is
// logged at Debug, zap's lowest level.
type hclogAdapter struct {
	z       *zap.Logger
	root    *zap.Logger // for ResetNamed
	implied []interface{}
}

func newHCLog(root *zap.Logger, name string) hclog.Logger {
	return &hclogAdapter{z: root.Named(name), root: root}
}

func (l *hclogAdapter) Log(level hclog.Level, msg string, args ...interface{}) {
	switch level {
	case hclog.Off:
	case hclog.Trace, hclog.Debug:
		l.z.Debug(msg, fields(args)...)
	case hclog.Warn:
		l.z.Warn(msg, fields(args)...)
	case hclog.Error:
		l.z.Error(msg, fields(args)...)
	default:
		l.z.Info(msg, fields(args)...)
	}
}

func (l *hclogAdapter) Trace(msg string, args ...interface{}) { l.Log(hclog.Trace, msg, args...) }
func (l *hclogAdapter) Debug(msg string, args ...interface{}) { l.Log(hclog.Debug, msg, args...) }
func (l *hclogAdapter) Info(msg string, args ...interface{})  { l.Log(hclog.Info, msg, args...) }
func (l *hclogAdapter) Warn(msg string, args ...interface{})  { l.Log(hclog.Warn, msg, args...) }
func (l *hclogAdapter) Error(msg string, args ...interface{}) { l.Log(hclog.Error, msg, args...) }

func (l *hclogAdapter) IsTrace() bool { return l.z.Core().Enabled(zapcore.DebugLevel) }
func (l *hclogAdapter) IsDebug() bool { return l.z.Core().Enabled(zapcore.DebugLevel) }
func (l *hclogAdapter) IsInfo() bool  { return l.z.Core().Enabled(zapcore.InfoLevel) }
func (l *hclogAdapter) IsWarn() bool  { return l.z.Core().Enabled(zapcore.WarnLevel) }
func (l *hclogAdapter) IsError() bool { return l.z.Core().Enabled(zapcore.ErrorLevel) }

func (l *hclogAdapter) ImpliedArgs() []interface{} { return l.implied }

func (l *hclogAdapter) With(args ...interface{}) hclog.Logger {
	return &hclogAdapter{
		z:       l.z.With(fields(args)...),
		root:    l.root,
		implied: append(append([]interface{}(nil), l.implied...), args...),
	}
}

func (l *hclogAdapter) Name() string { return l.z.Name() }

func (l *hclogAdapter) Named(name string) hclog.Logger {
	return &hclogAdapter{z: l.z.Named(name), root: l.root, implied: l.implied}
}

func (l *hclogAdapter) ResetNamed(name string) hclog.Logger {
	return &hclogAdapter{z: l.root.Named(name).With(fields(l.implied)...), root: l.root, implied: l.implied}
}

func (l *hclogAdapter) SetLevel(hclog.Level) {}

func (l *hclogAdapter) GetLevel() hclog.Level {
	switch {
	case l.IsDebug():
		return hclog.Debug
	case l.IsInfo():
		return hclog.Info
	case l.IsWarn():
		return hclog.Warn
	case l.IsError():
		return hclog.Error
	}
	return hclog.Off
}

func (l *hclogAdapter) StandardLogger(*hclog.StandardLoggerOptions) *log.Logger {
	return zap.NewStdLog(l.z)
}

func (l *hclogAdapter) StandardWriter(*hclog.StandardLoggerOptions) io.Writer {
	return zap.NewStdLog(l.z).Writer()
}

// fields turns hclog's alternating key, value arguments into zap fields.
func fields(args []interface{}) []zap.Field {
	fs := make([]zap.Field, 0, (len(args)+1)/2)
	for i := 0; i < len(args); i += 2 {
		if i+1 == len(args) {
			fs = append(fs, zap.Any("EXTRA_VALUE_AT_END", args[i]))
			break
		}
		key, ok := args[i].(string)
		if !ok {
			key = fmt.Sprint(args[i])
		}
		v := args[i+1]
		if f, ok := v.(hclog.Format); ok && len(f) > 0 {
			// hclog.Fmt("%+v", x): a format and its arguments.
			if format, ok := f[0].(string); ok {
				v = fmt.Sprintf(format, f[1:]...)
			}
		}
		fs = append(fs, zap.Any(key, v))
	}
	return fs
}
