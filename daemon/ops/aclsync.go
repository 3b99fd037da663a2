package ops

import (
	"context"
	"fmt"
	"slices"

	"go.uber.org/zap"

	"github.com/kmirror/kmirror/daemon/mirrorprops"
	"github.com/kmirror/kmirror/fetch/kafka"
	"github.com/kmirror/kmirror/raftstore"
)

// ACL sync (issue 21; acls.sync=true, off by default): at each config
// sync round the leader copies the source's ACL bindings of the mirror's
// topics (literal names) and of the groups it syncs (groups.include /
// groups.exclude, literal names) to the destination, for the principals
// acls.include matches and acls.exclude does not. An ALLOW WRITE or ALL
// on a topic still mirrored is not copied (the mirror topic is read-only
// until failover; after it, the topic is the writable copy and gets it).
// Bindings kmirror created are recorded on the mirror
// (raftstore.Mirror.SyncedACLs), and deleted once the source no longer
// has them; a binding on the destination kmirror did not create (an
// application's, or read-only's DENY) is never touched. Prefixed and
// wildcard bindings are not copied: they name other topics too.

// syncACLs runs one ACL sync round for mir over its topics (name -> still
// mirrored, i.e. not STOPPED).
func (o *Ops) syncACLs(ctx context.Context, mir *raftstore.Mirror, settings mirrorprops.Settings, src *kafka.Admin, topics map[string]bool) error {
	var want []kafka.ACL
	for _, rt := range []int8{kafka.ACLResourceTopic, kafka.ACLResourceGroup} {
		acls, err := src.ListACLs(ctx, rt)
		if err != nil {
			return fmt.Errorf("acls.sync: %w", err)
		}
		for _, a := range acls {
			if a.PatternType != kafka.ACLLiteral || !settings.SyncsACLsOf(a.Principal) {
				continue
			}
			switch a.ResourceType {
			case kafka.ACLResourceTopic:
				mirrored, ok := topics[a.Name]
				if !ok || a.Name == "*" {
					continue
				}
				if mirrored && a.Permission == kafka.ACLAllow && (a.Operation == kafka.ACLWrite || a.Operation == kafka.ACLOperationAll) {
					continue // read-only while mirrored
				}
			case kafka.ACLResourceGroup:
				if a.Name == "*" || !settings.SyncsGroup(a.Name) {
					continue
				}
			}
			want = append(want, a)
		}
	}
	var have []kafka.ACL
	for _, rt := range []int8{kafka.ACLResourceTopic, kafka.ACLResourceGroup} {
		acls, err := o.dest.ListACLs(ctx, rt)
		if err != nil {
			return fmt.Errorf("acls.sync: %w", err)
		}
		have = append(have, acls...)
	}
	owned := make([]kafka.ACL, len(mir.SyncedACLs))
	for i, b := range mir.SyncedACLs {
		owned[i] = kafka.ACL(b)
	}
	var create, drop, keep []kafka.ACL
	for _, a := range want {
		switch {
		case !slices.Contains(have, a):
			create = append(create, a)
			keep = append(keep, a)
		case slices.Contains(owned, a):
			keep = append(keep, a)
		}
	}
	for _, a := range owned {
		if !slices.Contains(want, a) {
			drop = append(drop, a)
		}
	}
	// Recorded before it is created, so a leader that stops in between
	// still owns (and can delete) what it created.
	record := append(slices.Clone(keep), drop...)
	if err := o.setSyncedACLs(ctx, mir, record); err != nil {
		return err
	}
	if err := o.dest.CreateACLs(ctx, create); err != nil {
		return fmt.Errorf("acls.sync: %w", err)
	}
	if err := o.dest.DeleteACLs(ctx, drop); err != nil {
		return fmt.Errorf("acls.sync: %w", err)
	}
	if len(create)+len(drop) > 0 {
		o.log.Info("ACLs synced from the source", zap.String("mirror", mir.Name), zap.Stringers("created", create), zap.Stringers("deleted", drop))
	}
	return o.setSyncedACLs(ctx, mir, keep)
}

// setSyncedACLs records acls as the mirror's synced ACLs when they differ.
func (o *Ops) setSyncedACLs(ctx context.Context, mir *raftstore.Mirror, acls []kafka.ACL) error {
	kafka.SortACLs(acls)
	b := toBindings(acls)
	if slices.Equal(b, mir.SyncedACLs) {
		return nil
	}
	if err := StoreErr(o.store.Apply(ctx, raftstore.SetSyncedACLs{Name: mir.Name, ACLs: b})); err != nil {
		return fmt.Errorf("acls.sync: record the ACLs it created: %w", err)
	}
	mir.SyncedACLs = b
	return nil
}

func toBindings(acls []kafka.ACL) []raftstore.ACLBinding {
	if len(acls) == 0 {
		return nil
	}
	out := make([]raftstore.ACLBinding, len(acls))
	for i, a := range acls {
		out[i] = raftstore.ACLBinding(a)
	}
	return out
}
