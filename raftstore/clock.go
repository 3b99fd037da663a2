package raftstore

import "time"

// Clock is a member's clock for its lease (design.md section 3): the
// leader times its grants and takeovers on it, the member its write window.
// Both are durations on one member's monotonic clock, so what may differ
// between members is the rate, never the offset; the lease window gives up
// an allowance for it (daemon/owner's clockRateAllowance). The process
// clock (SystemClock) is the only one in production; the in-process tier
// runs members on clocks of other rates (issue 19).
type Clock interface {
	// Now is the current time on this clock.
	Now() time.Time
	// Real maps a time on this clock to the process clock (time.Now's):
	// deadlines handed to the data path and the kernel.
	Real(t time.Time) time.Time
	// Local maps a time on the process clock (raft's contact stamps) to
	// this clock.
	Local(t time.Time) time.Time
}

// SystemClock is the process clock.
type SystemClock struct{}

// Now is time.Now.
func (SystemClock) Now() time.Time { return time.Now() }

// Real is t.
func (SystemClock) Real(t time.Time) time.Time { return t }

// Local is t.
func (SystemClock) Local(t time.Time) time.Time { return t }

// ClockOrSystem is c, or SystemClock when c is nil.
func ClockOrSystem(c Clock) Clock {
	if c == nil {
		return SystemClock{}
	}
	return c
}
