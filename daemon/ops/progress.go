package ops

import (
	"math"

	"github.com/kmirror/kmirror/daemon/api"
)

// fillProgress sets a describe row's time lag, rates, bytes left and ETA
// (issue 22) from its owner's live status st (live: the owner answered
// and the partition is not STOPPED), once ps.Lag is final: a lag that is
// not known (-1: offsets stale, the owner silent) leaves them not known; a
// lag of 0 (caught up, or STOPPED at its last mirrored position) makes
// them 0.
func fillProgress(ps *api.PartitionStatus, st api.LiveStatus, live bool) {
	ps.TimeLagMs, ps.BytesLeft, ps.EtaSeconds = -1, -1, -1
	if live {
		ps.RecordsPerSec, ps.BytesPerSec = st.RecordsPerSec, st.BytesPerSec
		ps.VerifiedUpTo, ps.VerifiedRecords, ps.VerifyMismatch, ps.VerifyNote = st.VerifiedUpTo, st.VerifiedRecords, st.VerifyMismatch, st.VerifyNote
	}
	switch {
	case ps.Lag == 0:
		ps.TimeLagMs, ps.BytesLeft, ps.EtaSeconds = 0, 0, 0
	case ps.Lag < 0 || !live:
		// Offsets stale or unknown: the records left are not known, but
		// the oldest record fetched and not yet on the destination is,
		// and its age is what a failover now would leave behind (the
		// metric shows it too).
		if live && st.TimeLagMs != nil && *st.TimeLagMs > 0 {
			ps.TimeLagMs = *st.TimeLagMs
		}
	default:
		if st.TimeLagMs != nil {
			ps.TimeLagMs = *st.TimeLagMs
		}
		if st.MirroredRecords > 0 {
			ps.BytesLeft = int64(math.Round(float64(ps.Lag) * float64(st.MirroredBytes) / float64(st.MirroredRecords)))
		}
		if st.RecordsPerSec > 0 {
			ps.EtaSeconds = int64(math.Ceil(float64(ps.Lag) / st.RecordsPerSec))
		}
	}
}
