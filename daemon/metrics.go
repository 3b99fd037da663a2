package daemon

import (
	"fmt"
	"net/http"
	"strconv"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/kmirror/kmirror/daemon/api"
	"github.com/kmirror/kmirror/daemon/httpapi"
	"github.com/kmirror/kmirror/daemon/leader"
	"github.com/kmirror/kmirror/daemon/owner"
	"github.com/kmirror/kmirror/fetch"
)

// metrics exposes the data path's per-partition progress on /metrics from
// the member's own registry (never the global one).
type metrics struct {
	engine   *fetch.Engine
	reg      *prometheus.Registry
	lag      *prometheus.Desc
	timeLag  *prometheus.Desc
	records  *prometheus.Desc
	bytes    *prometheus.Desc
	srcPos   *prometheus.Desc
	dstPos   *prometheus.Desc
	state    *prometheus.Desc
	diverg   *prometheus.Desc
	dups     *prometheus.Desc
	conv     *prometheus.Desc
	skip     *prometheus.Desc
	lateRecs *prometheus.Desc
	ckpt     *prometheus.Desc
	xlB      *prometheus.Desc
	xlFlr    *prometheus.Desc
	store    *prometheus.Desc
	// skipped returns the skipped-record counts of the partitions this
	// member owns (from the replicated state).
	skipped func() map[fetch.Key]int64
	// late returns, on the leader, the records of late batches found in
	// STOPPED partitions (leader/latebatch.go).
	late func() map[fetch.Key]int64
	// groups is the member's group offset syncer (nil in tests).
	groups      *owner.GroupSync
	groupRows   *prometheus.Desc
	groupLag    *prometheus.Desc
	groupConfls *prometheus.Desc
	// probe and lead feed the source reachability and automatic failover
	// metrics (nil in tests).
	probe       *sourceProbe
	lead        *leader.Leader
	srcDown     *prometheus.Desc
	autoFailovr *prometheus.Desc
	hookTries   *prometheus.Desc
	hookGaveUp  *prometheus.Desc
	probeAns    *prometheus.Desc
	probeAll    *prometheus.Desc
	// lease feeds kmirror_lease_valid and kmirror_lease_losses_total (nil
	// in tests).
	lease      func() (bool, uint64)
	leaseValid *prometheus.Desc
	leaseLost  *prometheus.Desc
	// verify feeds the background verification metrics (nil in tests).
	verify      *verifier
	verifiedRec *prometheus.Desc
	verifiedTo  *prometheus.Desc
	hookRuns    *prometheus.Desc
	// destination feeds kmirror_destination_unreachable_seconds (nil in
	// tests).
	destination *destinationProbe
	dstDown     *prometheus.Desc
	fetched     *prometheus.Desc
	fetchConns  *prometheus.Desc
	throttled   *prometheus.Desc
	// lead also feeds kmirror_read_only_unprotected_topics and
	// kmirror_read_only_unlifted_topics, auth kmirror_api_unauthorized_total
	// (nil in tests).
	roUnprotected *prometheus.Desc
	roUnlifted    *prometheus.Desc
	auth          *httpapi.Auth
	unauthorized  *prometheus.Desc
	// conns feeds kmirror_api_connections and
	// kmirror_api_connections_refused_total (nil in tests).
	conns        *httpapi.ConnLimiter
	connsOpen    *prometheus.Desc
	connsRefused *prometheus.Desc
	connsEvicted *prometheus.Desc
}

func newMetrics(engine *fetch.Engine, skipped func() map[fetch.Key]int64, groups *owner.GroupSync, probe *sourceProbe, lead *leader.Leader) *metrics {
	labels := []string{"mirror", "topic", "partition"}
	m := &metrics{
		engine:  engine,
		skipped: skipped,
		groups:  groups,
		probe:   probe,
		lead:    lead,
		connsOpen: prometheus.NewDesc("kmirror_api_connections",
			"Connections to this member's API open now.", nil, nil),
		connsRefused: prometheus.NewDesc("kmirror_api_connections_refused_total",
			fmt.Sprintf("API connections closed at accept because their client IP held the most allowed (%d) or the member did (%d), all busy.",
				httpapi.MaxConnsPerClient, httpapi.MaxConns), nil, nil),
		connsEvicted: prometheus.NewDesc("kmirror_api_connections_evicted_total",
			"Idle keep-alive API connections closed to make room for a new connection beyond a bound (per client IP or in all).", nil, nil),
		unauthorized: prometheus.NewDesc("kmirror_api_unauthorized_total",
			"API requests this member refused for a missing or wrong bearer token (api.token_file).", nil, nil),
		roUnprotected: prometheus.NewDesc("kmirror_read_only_unprotected_topics",
			"Mirrored topics the raft leader could not keep read-only in its last round (no authorizer or no right to manage ACLs: all of them; "+
				"an ALLOW WRITE for User:*: those topics). Only the leader reports it.", nil, nil),
		roUnlifted: prometheus.NewDesc("kmirror_read_only_unlifted_topics",
			"Failed-over (STOPPED) or removed topics whose DENY WRITE ACLs the raft leader could not delete in its last round: "+
				"applications still cannot write them. Only the leader reports it.", nil, nil),
		dstDown: prometheus.NewDesc("kmirror_destination_unreachable_seconds",
			"How long the destination cluster has not answered this member (0 while it answers): its probe, or a produce of one of "+
				"its partitions written and left unanswered. Past lease_ttl, while it answers another member, this member's partitions move.", nil, nil),
		srcDown: prometheus.NewDesc("kmirror_source_unreachable_seconds",
			"How long the mirror's source cluster has not answered this member's probe (0 while it answers).", []string{"mirror"}, nil),
		throttled: prometheus.NewDesc("kmirror_destination_throttle_seconds_total",
			"Produce throttle time destination brokers asked of this member (throttle_time_ms of client quotas, KIP-219); kmirror waits it out.",
			[]string{"broker"}, nil),
		fetchConns: prometheus.NewDesc("kmirror_source_fetch_connections",
			"Fetch connections (fetch sessions over disjoint partitions) this member keeps to a source broker: one per 5 ms of "+
				"round trip up to 8, or the mirror's fetch.connections.", []string{"mirror", "broker"}, nil),
		fetched: prometheus.NewDesc("kmirror_source_fetched_bytes_total",
			"Record bytes this member fetched from the mirror's source cluster (mirroring and resume walks).", []string{"mirror"}, nil),
		probeAns: prometheus.NewDesc("kmirror_failover_probe_answered_members",
			"Members (the leader included) that answered the raft leader's last reachability probe round, on which automatic failover "+
				"and placement decide; exported by the leader. A member that does not answer counts as reaching every source.", nil, nil),
		probeAll: prometheus.NewDesc("kmirror_group_members", "Members of the group in the replicated state; exported by the raft leader.", nil, nil),
		verifiedRec: prometheus.NewDesc("kmirror_partition_verified_records_total",
			"Records the background verification (verify.mode) compared on both clusters since this member took the partition.", labels, nil),
		verifiedTo: prometheus.NewDesc("kmirror_partition_verified_offset",
			"Source offset below which the background verification compared every mirrored record in its current full pass "+
				"(sampled: the highest offset sampled, plus one).", labels, nil),
		leaseValid: prometheus.NewDesc("kmirror_lease_valid",
			"1 while this member may write its partitions (its lease from the raft leader is valid and its state caught up), else 0: "+
				"its partitions stand still and move to other members after lease_ttl.", nil, nil),
		leaseLost: prometheus.NewDesc("kmirror_lease_losses_total", "Times this member lost its lease (self-fenced) since it started.", nil, nil),
		hookTries: prometheus.NewDesc("kmirror_failover_hook_attempts_total",
			"Failover hook attempts (failover.hook.exec, failover.hook.url) this member made as raft leader, by outcome (ok, error).",
			[]string{"mirror", "outcome"}, nil),
		hookGaveUp: prometheus.NewDesc("kmirror_failover_hook_gave_up_total",
			"Failover hook runs this member, as raft leader, gave up after failover.hook.retries (what the hook switches was not switched).",
			[]string{"mirror"}, nil),
		hookRuns: prometheus.NewDesc("kmirror_failover_hook_runs",
			"The mirror's failover hook runs kept in the replicated state (pending and the last 20 finished), by state "+
				"(pending, retrying, succeeded, failed); exported by the raft leader.", []string{"mirror", "state"}, nil),
		autoFailovr: prometheus.NewDesc("kmirror_automatic_failovers_total",
			"Topics this member, as raft leader, failed over automatically (failover.auto.after.ms).", []string{"mirror"}, nil),
		groupRows: prometheus.NewDesc("kmirror_group_partitions",
			"Consumer group partitions this member syncs, by sync state (synced, pending, conflict).", []string{"mirror", "state"}, nil),
		groupLag: prometheus.NewDesc("kmirror_group_sync_lag_seconds",
			"Longest time a source group commit of the mirror has waited without reaching the destination (0 when all are synced).", []string{"mirror"}, nil),
		groupConfls: prometheus.NewDesc("kmirror_group_conflicts_total",
			"Group partitions that went into conflict (a group in use on the destination, a group-name conflict, a destination "+
				"offset ahead of the source's) since this member started.", []string{"mirror"}, nil),
		reg: prometheus.NewRegistry(),
		lag: prometheus.NewDesc("kmirror_partition_lag_records", "Committed source offsets not yet mirrored; "+
			"absent while the source's end is unknown (a partition starting, or stopped before its first fetch).", labels, nil),
		timeLag: prometheus.NewDesc("kmirror_partition_time_lag_seconds",
			"Replication latency: how long the oldest source record not yet on the destination has been on the source "+
				"(now minus its timestamp; 0 when caught up); absent while not known.", labels, nil),
		records: prometheus.NewDesc("kmirror_partition_mirrored_records_total",
			"Records the destination acknowledged since this member took the partition (rate(): the record rate).", labels, nil),
		bytes: prometheus.NewDesc("kmirror_partition_mirrored_bytes_total",
			"Bytes of record batches, as written (compressed), the destination acknowledged since this member took the partition "+
				"(rate(): the byte rate).", labels, nil),
		srcPos: prometheus.NewDesc("kmirror_partition_source_offset", "Next source offset to mirror.", labels, nil),
		dstPos: prometheus.NewDesc("kmirror_partition_destination_offset", "Next destination offset.", labels, nil),
		state:  prometheus.NewDesc("kmirror_partition_state", "1 for the partition's current data-path state.", append(labels, "state"), nil),
		diverg: prometheus.NewDesc("kmirror_divergences_total", "Partitions stopped as DIVERGED since the member started.", nil, nil),
		dups: prometheus.NewDesc("kmirror_partition_duplicate_records_total",
			"Records of kmirror's own batches found twice on the destination since this member took the partition.", labels, nil),
		conv: prometheus.NewDesc("kmirror_partition_converted_records_total",
			"Records mirrored from legacy message sets (message format v0/v1, Kafka before 0.11), converted to v2 batches "+
				"(headers empty), since this member took the partition.", labels, nil),
		xlB: prometheus.NewDesc("kmirror_partition_translation_bytes",
			"Memory the partition's offset-translation breakpoints take (bounded by the source's retention and translation_max_bytes).", labels, nil),
		xlFlr: prometheus.NewDesc("kmirror_partition_translation_floor",
			"Source offset from which the partition's offsets translate, when translation_max_bytes dropped older breakpoints "+
				"(absent when every offset since the start translates): groups committed below it are not synced.", labels, nil),
		store: prometheus.NewDesc("kmirror_offsets_store_bytes",
			"Memory this member's index of the __kmirror_offsets topic takes: a checkpoint per partition and an entry per translation segment "+
				"(segments themselves are read when a partition is taken).", nil, nil),
		ckpt: prometheus.NewDesc("kmirror_partition_checkpoint_failing",
			"1 while the partition's checkpoint cannot be written to the offsets topic (describe says why), else 0.", labels, nil),
		lateRecs: prometheus.NewDesc("kmirror_partition_late_records_total",
			"Records of kmirror's own producer that landed in a STOPPED partition after its recorded last mirrored position "+
				"(a produce request the network held past its sender's lease; describe names them); exported by the leader.", labels, nil),
		skip: prometheus.NewDesc("kmirror_partition_skipped_records_total",
			"Source records deleted before they were mirrored that an operator accepted to skip (kmirror resume --accept-gap); "+
				"exported by the partition's owner.", labels, nil),
	}
	m.reg.MustRegister(m, collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return m
}

func (m *metrics) handler() http.Handler {
	return promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{})
}

func (m *metrics) Describe(ch chan<- *prometheus.Desc) {
	ch <- m.lag
	ch <- m.timeLag
	ch <- m.records
	ch <- m.bytes
	ch <- m.lateRecs
	ch <- m.srcPos
	ch <- m.dstPos
	ch <- m.state
	ch <- m.diverg
	ch <- m.dups
	ch <- m.conv
	ch <- m.skip
	ch <- m.ckpt
	ch <- m.xlB
	ch <- m.xlFlr
	ch <- m.store
	ch <- m.groupRows
	ch <- m.groupLag
	ch <- m.groupConfls
	ch <- m.srcDown
	ch <- m.dstDown
	ch <- m.roUnprotected
	ch <- m.roUnlifted
	ch <- m.unauthorized
	ch <- m.connsOpen
	ch <- m.connsRefused
	ch <- m.connsEvicted
	ch <- m.autoFailovr
	ch <- m.hookTries
	ch <- m.hookGaveUp
	ch <- m.probeAns
	ch <- m.probeAll
	ch <- m.leaseValid
	ch <- m.verifiedRec
	ch <- m.verifiedTo
	ch <- m.leaseLost
	ch <- m.hookRuns
	ch <- m.fetched
	ch <- m.fetchConns
	ch <- m.throttled
}

func (m *metrics) Collect(ch chan<- prometheus.Metric) {
	ch <- prometheus.MustNewConstMetric(m.diverg, prometheus.CounterValue, float64(m.engine.Divergences()))
	for mirror, n := range m.engine.FetchedBytes() {
		ch <- prometheus.MustNewConstMetric(m.fetched, prometheus.CounterValue, float64(n), mirror)
	}
	for mirror, per := range m.engine.FetchConnections() {
		for broker, n := range per {
			ch <- prometheus.MustNewConstMetric(m.fetchConns, prometheus.GaugeValue, float64(n), mirror, broker)
		}
	}
	for broker, d := range m.engine.ThrottleTime() {
		ch <- prometheus.MustNewConstMetric(m.throttled, prometheus.CounterValue, d.Seconds(), broker)
	}
	for _, st := range m.engine.Statuses() {
		l := []string{st.Key.Mirror, st.Key.Topic, itoa(st.Key.Partition)}
		if st.SourceEnd >= 0 { // unknown: no series rather than a 0 that reads as caught up
			ch <- prometheus.MustNewConstMetric(m.lag, prometheus.GaugeValue, float64(st.Lag), l...)
		}
		if st.TimeLagMs >= 0 {
			ch <- prometheus.MustNewConstMetric(m.timeLag, prometheus.GaugeValue, float64(st.TimeLagMs)/1000, l...)
		}
		ch <- prometheus.MustNewConstMetric(m.records, prometheus.CounterValue, float64(st.MirroredRecords), l...)
		ch <- prometheus.MustNewConstMetric(m.bytes, prometheus.CounterValue, float64(st.MirroredBytes), l...)
		ch <- prometheus.MustNewConstMetric(m.srcPos, prometheus.GaugeValue, float64(st.Position.SourceOffset), l...)
		ch <- prometheus.MustNewConstMetric(m.dstPos, prometheus.GaugeValue, float64(st.Position.DestinationOffset), l...)
		ch <- prometheus.MustNewConstMetric(m.state, prometheus.GaugeValue, 1, append(l, string(st.State))...)
		ch <- prometheus.MustNewConstMetric(m.dups, prometheus.CounterValue, float64(st.DuplicateRecords), l...)
		ch <- prometheus.MustNewConstMetric(m.conv, prometheus.CounterValue, float64(st.ConvertedRecords), l...)
		failing := 0.0
		if st.CheckpointFailing {
			failing = 1
		}
		ch <- prometheus.MustNewConstMetric(m.ckpt, prometheus.GaugeValue, failing, l...)
		ch <- prometheus.MustNewConstMetric(m.xlB, prometheus.GaugeValue, float64(st.TranslationBytes), l...)
		if st.TranslationFloor > 0 {
			ch <- prometheus.MustNewConstMetric(m.xlFlr, prometheus.GaugeValue, float64(st.TranslationFloor), l...)
		}
	}
	ch <- prometheus.MustNewConstMetric(m.store, prometheus.GaugeValue, float64(m.engine.OffsetsStoreBytes()))
	if m.groups != nil {
		m.collectGroups(ch)
	}
	if m.conns != nil {
		ch <- prometheus.MustNewConstMetric(m.connsOpen, prometheus.GaugeValue, float64(m.conns.Open()))
		ch <- prometheus.MustNewConstMetric(m.connsRefused, prometheus.CounterValue, float64(m.conns.Refused()))
		ch <- prometheus.MustNewConstMetric(m.connsEvicted, prometheus.CounterValue, float64(m.conns.Evicted()))
	}
	if m.auth.TokenRequired() {
		ch <- prometheus.MustNewConstMetric(m.unauthorized, prometheus.CounterValue, float64(m.auth.UnauthorizedTotal()))
	}
	if m.lead != nil {
		if unprotected, unlifted, ok := m.lead.ReadOnlyGauges(); ok {
			ch <- prometheus.MustNewConstMetric(m.roUnprotected, prometheus.GaugeValue, float64(unprotected))
			ch <- prometheus.MustNewConstMetric(m.roUnlifted, prometheus.GaugeValue, float64(unlifted))
		}
	}
	if m.destination != nil {
		ch <- prometheus.MustNewConstMetric(m.dstDown, prometheus.GaugeValue, float64(m.destination.reach().UnreachableMs)/1000)
	}
	if m.probe != nil {
		for _, r := range m.probe.reach() {
			ch <- prometheus.MustNewConstMetric(m.srcDown, prometheus.GaugeValue, float64(r.UnreachableMs)/1000, r.Mirror)
		}
	}
	if m.lead != nil {
		for mirror, n := range m.lead.AutoFailovers() {
			ch <- prometheus.MustNewConstMetric(m.autoFailovr, prometheus.CounterValue, float64(n), mirror)
		}
		attempts, gaveUp := m.lead.HookAttempts()
		for k, n := range attempts {
			ch <- prometheus.MustNewConstMetric(m.hookTries, prometheus.CounterValue, float64(n), k[0], k[1])
		}
		for mirror, n := range gaveUp {
			ch <- prometheus.MustNewConstMetric(m.hookGaveUp, prometheus.CounterValue, float64(n), mirror)
		}
		for k, n := range m.lead.HookRunStates() {
			ch <- prometheus.MustNewConstMetric(m.hookRuns, prometheus.GaugeValue, float64(n), k[0], k[1])
		}
		if answered, members, ok := m.lead.ProbeMembers(); ok {
			ch <- prometheus.MustNewConstMetric(m.probeAns, prometheus.GaugeValue, float64(answered))
			ch <- prometheus.MustNewConstMetric(m.probeAll, prometheus.GaugeValue, float64(members))
		}
	}
	if m.verify != nil {
		for k, v := range m.verify.progress() {
			l := []string{k.Mirror, k.Topic, itoa(k.Partition)}
			ch <- prometheus.MustNewConstMetric(m.verifiedRec, prometheus.CounterValue, float64(v.Records), l...)
			if v.UpTo >= 0 {
				ch <- prometheus.MustNewConstMetric(m.verifiedTo, prometheus.GaugeValue, float64(v.UpTo), l...)
			}
		}
	}
	if m.lease != nil {
		valid, losses := m.lease()
		v := 0.0
		if valid {
			v = 1
		}
		ch <- prometheus.MustNewConstMetric(m.leaseValid, prometheus.GaugeValue, v)
		ch <- prometheus.MustNewConstMetric(m.leaseLost, prometheus.CounterValue, float64(losses))
	}
	if m.late != nil {
		for k, n := range m.late() {
			ch <- prometheus.MustNewConstMetric(m.lateRecs, prometheus.CounterValue, float64(n), k.Mirror, k.Topic, itoa(k.Partition))
		}
	}
	if m.skipped != nil {
		for k, n := range m.skipped() {
			ch <- prometheus.MustNewConstMetric(m.skip, prometheus.CounterValue, float64(n), k.Mirror, k.Topic, itoa(k.Partition))
		}
	}
}

func itoa(i int32) string { return strconv.Itoa(int(i)) }

func (m *metrics) collectGroups(ch chan<- prometheus.Metric) {
	type mirrorState struct{ mirror, state string }
	counts := map[mirrorState]int{}
	lag := map[string]int64{}
	for _, r := range m.groups.LiveRows() {
		counts[mirrorState{r.Mirror, r.State}]++
		lag[r.Mirror] = max(lag[r.Mirror], r.SyncLagMs)
	}
	for mirror := range lag {
		for _, st := range []string{api.GroupSynced, api.GroupPending, api.GroupConflict} {
			ch <- prometheus.MustNewConstMetric(m.groupRows, prometheus.GaugeValue, float64(counts[mirrorState{mirror, st}]), mirror, st)
		}
		ch <- prometheus.MustNewConstMetric(m.groupLag, prometheus.GaugeValue, float64(lag[mirror])/1000, mirror)
	}
	for mirror, n := range m.groups.ConflictCounts() {
		ch <- prometheus.MustNewConstMetric(m.groupConfls, prometheus.CounterValue, float64(n), mirror)
	}
}
