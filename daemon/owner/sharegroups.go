package owner

import (
	"context"
	"errors"
	"fmt"
	"sort"

	"github.com/kmirror/kmirror/daemon/api"
	"github.com/kmirror/kmirror/daemon/mirrorprops"
	"github.com/kmirror/kmirror/fetch"
	"github.com/kmirror/kmirror/fetch/kafka"
	"github.com/kmirror/kmirror/fetch/kafka/kwire"
)

// Share groups (KIP-932, issue 21 section 5). A share group's position on
// a partition is its share-partition start offset (SPSO): every record
// below it is acknowledged or archived; records at or above it may be
// in flight, acknowledged or not yet delivered, which an offset cannot
// say. kmirror carries the SPSO, translated exactly like a consumer
// group's commit (the first mirrored record at or after it), with
// AlterShareGroupOffsets while the group has no members on the
// destination, never backwards. A consumer of the group on the
// destination may therefore see again records the source had
// acknowledged above the SPSO (share groups redeliver; nothing is lost).

// syncShareGroup syncs one share group's SPSOs of parts and returns a row
// per partition the group has state for.
func (g *GroupSync) syncShareGroup(ctx context.Context, mirror string, src *kafka.Admin, group string, dg kwire.GroupListing, exists bool,
	parts []kafka.TopicPartition, tr translator) []api.GroupStatus {
	spso, err := src.ShareGroupOffsets(ctx, group, parts)
	if err != nil {
		g.warn(mirror+"/"+group, "share group offsets of a source group not readable; retrying next round", err)
		return g.pendingRows(func(k groupRowKey) bool { return k.Mirror == mirror && k.Group == group },
			"source share group offsets not readable: "+err.Error())
	}
	tps := make([]kafka.TopicPartition, 0, len(spso))
	for tp := range spso {
		tps = append(tps, tp)
	}
	sort.Slice(tps, func(i, j int) bool {
		return tps[i].Topic < tps[j].Topic || (tps[i].Topic == tps[j].Topic && tps[i].Partition < tps[j].Partition)
	})
	rows := make([]api.GroupStatus, len(tps))
	for i, tp := range tps {
		rows[i] = api.GroupStatus{Mirror: mirror, Group: group, Kind: "share", Topic: tp.Topic, Partition: tp.Partition,
			SourceCommitted: spso[tp], DestinationCommitted: -1, Member: g.nodeID}
	}
	setAll := func(state, reason string) []api.GroupStatus {
		for i := range rows {
			rows[i].State, rows[i].Reason = state, reason
		}
		return rows
	}
	if len(rows) == 0 {
		return nil
	}
	if exists && dg.Type != "share" {
		kind := dg.Type
		if kind == "" {
			kind = "protocol type " + dg.ProtocolType
		}
		return setAll(api.GroupConflict, fmt.Sprintf("a group named %s exists on the destination as a %s group, not a share group (a group-name "+
			"conflict, KIP-1279): kmirror leaves it alone; rename or delete one of them, or exclude the group with %s (kmirror alter)",
			group, kind, mirrorprops.PropGroupsExclude))
	}
	dst, err := g.dest.ShareGroupOffsets(ctx, group, tps)
	if kafka.IsNoShareGroups(err) {
		for i := range rows {
			rows[i].Unsupported = true
		}
		return setAll(api.GroupConflict, "the destination cluster has no share groups (AlterShareGroupOffsets needs Kafka 4.2 or newer): "+
			"kmirror cannot carry this share group's position; its consumers start on the destination from share.auto.offset.reset")
	}
	if err != nil {
		return setAll(api.GroupPending, "destination share group offsets unknown: "+err.Error())
	}
	for i, tp := range tps {
		if o, ok := dst[tp]; ok {
			rows[i].DestinationCommitted = o
		}
	}
	if exists && dg.State != "Empty" {
		return setAll(api.GroupConflict, fmt.Sprintf("share group %s has members on the destination (state %s): kmirror sets the start "+
			"offsets only of a share group nobody uses there; stop its consumers on the destination until failover, or exclude the group "+
			"with %s (kmirror alter)", group, dg.State, mirrorprops.PropGroupsExclude))
	}
	alter := map[kafka.TopicPartition]int64{}
	for i, tp := range tps {
		r := &rows[i]
		d, capped, err := tr(fetch.Key{Mirror: mirror, Topic: tp.Topic, Partition: tp.Partition}, r.SourceCommitted)
		if err != nil {
			r.State, r.Reason = api.GroupPending, "no translation: "+err.Error()
			continue
		}
		switch {
		case r.DestinationCommitted > d:
			r.State, r.Ahead, r.Reason = api.GroupConflict, true, fmt.Sprintf("the destination's start offset %d is ahead of %d, the "+
				"translation of the source's %d: kmirror never moves a start offset backwards", r.DestinationCommitted, d, r.SourceCommitted)
		case r.DestinationCommitted < d:
			alter[tp] = d
			fallthrough
		default:
			r.State = api.GroupSynced
			if capped {
				r.State, r.Reason = api.GroupPending, fmt.Sprintf("the source start offset is past what is mirrored so far: set the "+
					"destination end %d; it follows as mirroring catches up", d)
			}
		}
	}
	if len(alter) == 0 {
		return rows
	}
	refused, err := g.dest.AlterShareGroupOffsets(ctx, group, alter)
	for i, tp := range tps {
		d, ok := alter[tp]
		if !ok {
			continue
		}
		r := &rows[i]
		rerr := err
		if rerr == nil {
			rerr = refused[tp]
		}
		var kerr *kwire.Error
		switch {
		case rerr == nil:
			r.DestinationCommitted = d
		case kafka.IsGroupInUse(rerr) || (errors.As(rerr, &kerr) && kerr.Code == kwire.CodeNonEmptyGroup):
			r.State, r.Reason = api.GroupConflict, fmt.Sprintf("share group %s got members on the destination (refused: %v): kmirror "+
				"leaves a group in use alone", group, rerr)
		default:
			r.State, r.Reason = api.GroupPending, "setting the start offset failed, retrying: "+rerr.Error()
		}
	}
	return rows
}
