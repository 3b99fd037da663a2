package raftstore

import (
	"fmt"
	"maps"
	"slices"
	"strings"
)

// Applies of the mirror-level commands (mirror definitions, patterns,
// hints, ACL records) and of the group positions kept across a truncation.

// mirror returns mirror name, or ErrNotFound.
func (s *State) mirror(name string) (*Mirror, error) {
	mir, ok := s.Mirrors[name]
	if !ok {
		return nil, fmt.Errorf("%w: mirror %q", ErrNotFound, name)
	}
	return mir, nil
}

func (s *State) applyCreateMirror(c CreateMirror, index uint64) error {
	name := c.Mirror.Name
	if name == "" || strings.Contains(name, "/") {
		return fmt.Errorf("%w: mirror name %q must be non-empty and contain no '/'", ErrInvalid, name)
	}
	if _, ok := s.Mirrors[name]; ok {
		return fmt.Errorf("%w: mirror %q", ErrExists, name)
	}
	s.Mirrors[name] = c.Mirror.Clone()
	return nil
}

func (s *State) applyAlterMirror(c AlterMirror, _ uint64) error {
	mir, err := s.mirror(c.Name)
	if err != nil {
		return err
	}
	if len(c.Bootstrap) == 0 {
		return fmt.Errorf("%w: mirror %q: an empty bootstrap list", ErrInvalid, c.Name)
	}
	mir.Bootstrap = slices.Clone(c.Bootstrap)
	mir.Properties = maps.Clone(c.Properties)
	return nil
}

func (s *State) applySetTopicPatterns(c SetTopicPatterns, _ uint64) error {
	mir, err := s.mirror(c.Name)
	if err != nil {
		return err
	}
	mir.Include, mir.Exclude = slices.Clone(c.Include), slices.Clone(c.Exclude)
	if len(mir.Include) == 0 {
		mir.Skipped = nil // nothing matches any more
	}
	return nil
}

func (s *State) applySetDiscoverySkips(c SetDiscoverySkips, _ uint64) error {
	mir, err := s.mirror(c.Name)
	if err != nil {
		return err
	}
	mir.Skipped = maps.Clone(c.Skipped)
	if len(mir.Skipped) == 0 {
		mir.Skipped = nil
	}
	return nil
}

func (s *State) applySetConfigSyncError(c SetConfigSyncError, _ uint64) error {
	t, ok := s.Topic(c.Mirror, c.Topic)
	if !ok {
		return fmt.Errorf("%w: topic %q", ErrNotFound, TopicKey(c.Mirror, c.Topic))
	}
	t.ConfigSyncError = c.Error
	return nil
}

func (s *State) applySetSyncedACLs(c SetSyncedACLs, _ uint64) error {
	mir, err := s.mirror(c.Name)
	if err != nil {
		return err
	}
	mir.SyncedACLs = slices.Clone(c.ACLs)
	return nil
}

func (s *State) applySetWriteDenials(c SetWriteDenials, _ uint64) error {
	if c.Topic == "" {
		return fmt.Errorf("%w: write denials need a topic", ErrInvalid)
	}
	if len(c.Principals) == 0 {
		delete(s.WriteDenials, c.Topic)
		return nil
	}
	if s.WriteDenials == nil {
		s.WriteDenials = map[string][]string{}
	}
	p := slices.Clone(c.Principals)
	slices.Sort(p)
	s.WriteDenials[c.Topic] = slices.Compact(p)
	return nil
}

func (s *State) applySetStopFence(c SetStopFence, _ uint64) error {
	if c.Topic == "" {
		return fmt.Errorf("%w: a stop fence needs a topic", ErrInvalid)
	}
	if c.Principal == "" {
		delete(s.StopFences, c.Topic)
		return nil
	}
	if s.StopFences == nil {
		s.StopFences = map[string]string{}
	}
	s.StopFences[c.Topic] = c.Principal
	return nil
}

func (s *State) applyDeleteMirror(c DeleteMirror, index uint64) error {
	if _, err := s.mirror(c.Name); err != nil {
		return err
	}
	delete(s.Mirrors, c.Name)
	s.dropGroupRestores(c.Name, "")
	for k, t := range s.Topics {
		if t.Mirror == c.Name {
			delete(s.Topics, k)
		}
	}
	return nil
}

func (s *State) applySetMirrorNotes(c SetMirrorNotes, _ uint64) error {
	mir, err := s.mirror(c.Name)
	if err != nil {
		return err
	}
	mir.Notes = slices.Clone(c.Notes)
	return nil
}

func (s *State) applySetGroupRestores(c SetGroupRestores, _ uint64) error {
	if c.Mirror == "" || c.Topic == "" {
		return fmt.Errorf("%w: group restores need a mirror and a topic", ErrInvalid)
	}
	k := TopicKey(c.Mirror, c.Topic)
	if len(c.Restores) == 0 {
		delete(s.GroupRestores, k)
		return nil
	}
	if s.GroupRestores == nil {
		s.GroupRestores = map[string][]GroupRestore{}
	}
	s.GroupRestores[k] = slices.Clone(c.Restores)
	return nil
}

func (s *State) applyClearGroupRestores(c ClearGroupRestores, _ uint64) error {
	k := TopicKey(c.Key.Mirror, c.Key.Topic)
	left := slices.DeleteFunc(slices.Clone(s.GroupRestores[k]), func(r GroupRestore) bool {
		return r.Partition == c.Key.Partition && slices.Contains(c.Done, r)
	})
	if len(left) == 0 {
		delete(s.GroupRestores, k)
	} else {
		s.GroupRestores[k] = left
	}
	return nil
}

// dropGroupRestores forgets the kept positions of a mirror's topic, or of
// all its topics when topic is "".
func (s *State) dropGroupRestores(mirror, topic string) {
	for k := range s.GroupRestores {
		if (topic != "" && k == TopicKey(mirror, topic)) || (topic == "" && strings.HasPrefix(k, mirror+"/")) {
			delete(s.GroupRestores, k)
		}
	}
}
