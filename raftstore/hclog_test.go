package raftstore

import (
	"errors"
	"testing"

	"github.com/hashicorp/go-hclog"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"
)

func TestHCLogAdapter(t *testing.T) {
	core, logs := observer.New(zapcore.DebugLevel)
	l := newHCLog(zap.New(core), "raft").With("node", "n1")

	l.Trace("t")
	l.Warn("w", "error", errors.New("boom"), "odd")
	l.Named("snap").Error("e")
	l.ResetNamed("other").Info("i")

	got := logs.AllUntimed()
	want := []struct {
		level zapcore.Level
		name  string
		msg   string
	}{
		{zapcore.DebugLevel, "raft", "t"},
		{zapcore.WarnLevel, "raft", "w"},
		{zapcore.ErrorLevel, "raft.snap", "e"},
		{zapcore.InfoLevel, "other", "i"},
	}
	if len(got) != len(want) {
		t.Fatalf("%d entries, want %d: %+v", len(got), len(want), got)
	}
	for i, w := range want {
		e := got[i]
		if e.Level != w.level || e.LoggerName != w.name || e.Message != w.msg {
			t.Errorf("entry %d = %s %s %q, want %s %s %q", i, e.Level, e.LoggerName, e.Message, w.level, w.name, w.msg)
		}
		if e.ContextMap()["node"] != "n1" {
			t.Errorf("entry %d lost the implied node field: %v", i, e.ContextMap())
		}
	}
	if f := got[1].ContextMap(); f["error"] != "boom" || f["EXTRA_VALUE_AT_END"] != "odd" {
		t.Errorf("warn fields = %v", f)
	}
	if l.GetLevel() != hclog.Debug || !l.IsTrace() {
		t.Errorf("level %s, want debug", l.GetLevel())
	}
}
