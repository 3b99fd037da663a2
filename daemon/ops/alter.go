package ops

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/kmirror/kmirror/daemon/api"
	"github.com/kmirror/kmirror/daemon/mirrorprops"
	"github.com/kmirror/kmirror/fetch/kafka"
	"github.com/kmirror/kmirror/fetch/kafka/kwire"
	"github.com/kmirror/kmirror/raftstore"
)

// AlterMirror replaces a mirror's properties: the group filters and sync
// interval take effect at the next sync, a new bootstrap.servers, client.id
// or security setting when the data path reconnects (at once for new
// security settings). New connection settings must reach the same source
// cluster (its cluster ID is checked, with the new credentials): a mirror
// never changes the cluster it mirrors.
func (o *Ops) AlterMirror(ctx context.Context, req api.CreateMirrorRequest) error {
	if c, err := o.member.ToLeader(ctx); err != nil || c != nil {
		if err != nil {
			return err
		}
		return c.AlterMirror(ctx, req)
	}
	settings, err := mirrorprops.Parse(req.Name, req.Properties)
	if err != nil {
		return err
	}
	var mir *raftstore.Mirror
	o.store.Read(func(s *raftstore.State) {
		if x, ok := s.Mirrors[req.Name]; ok {
			mir = x.Clone()
		}
	})
	if mir == nil {
		return fmt.Errorf("%w: mirror %s does not exist (see kmirror list)", api.ErrNotFound, req.Name)
	}
	if _, oldKey := mirrorprops.Security(*mir); !slices.Equal(settings.Bootstrap, mir.Bootstrap) || settings.Security.Key() != oldKey {
		id, err := o.checkSource(ctx, settings)
		if err != nil {
			return err
		}
		if mir.SourceClusterID != "" && id != mir.SourceClusterID {
			return fmt.Errorf("%w: bootstrap.servers %s reaches cluster %s, but mirror %s mirrors cluster %s: a mirror cannot move to "+
				"another cluster; create a new mirror for it", api.ErrInvalid, strings.Join(settings.Bootstrap, ","), id, req.Name, mir.SourceClusterID)
		}
	}
	return StoreErr(o.store.Apply(ctx, raftstore.AlterMirror{Name: req.Name, Bootstrap: settings.Bootstrap, Properties: req.Properties}))
}

// checkSource connects to a source cluster with new settings (reading
// their files here, on the member that handles the request) and returns
// its cluster ID. Credential and certificate failures are ErrInvalid: the
// settings are wrong; an unreachable cluster is ErrUnavailable.
func (o *Ops) checkSource(ctx context.Context, settings mirrorprops.Settings) (string, error) {
	if _, err := settings.Security.Resolve(); err != nil {
		return "", fmt.Errorf("%w: %v", api.ErrInvalid, err)
	}
	src := kafka.NewAdmin("source cluster", settings.Bootstrap, o.cfg.ClientID, mirrorprops.SecurityOf(settings.Security))
	defer src.Close()
	cctx, cancel := context.WithTimeout(ctx, adminTimeout)
	defer cancel()
	id, err := src.ClusterID(cctx)
	switch {
	case errors.Is(err, kwire.ErrAuthentication):
		return "", fmt.Errorf("%w: %v", api.ErrInvalid, err)
	case err != nil:
		return "", fmt.Errorf("%w: %v", api.ErrUnavailable, err)
	}
	return id, nil
}
