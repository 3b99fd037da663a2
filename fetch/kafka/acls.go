package kafka

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/segmentio/kafka-go/protocol/createacls"
	"github.com/segmentio/kafka-go/protocol/deleteacls"
	"github.com/segmentio/kafka-go/protocol/describeacls"

	"github.com/kmirror/kmirror/fetch/kafka/kwire"
)

// ACL enums of the Kafka protocol (org.apache.kafka.common.acl and
// org.apache.kafka.common.resource).
const (
	aclResourceTopic   int8 = 2
	aclPatternAny      int8 = 1
	aclPatternLiteral  int8 = 3
	aclPatternPrefixed int8 = 4
	aclOperationAny    int8 = 1
	aclOperationAll    int8 = 2
	aclOperationWrite  int8 = 4
	aclPermissionAny   int8 = 1
	aclPermissionDeny  int8 = 2
	aclPermissionAllow int8 = 3

	codeSecurityDisabled int16 = 54
)

// ErrNoAuthorizer means the cluster runs no authorizer, so ACLs cannot be
// read or set.
var ErrNoAuthorizer = errors.New("the cluster has no authorizer (authorizer.class.name is not set)")

// TopicWriters are the principals that ACLs let write one topic.
type TopicWriters struct {
	// Allowed: an ALLOW ACL for WRITE or ALL matches the topic, by a
	// literal name, the literal wildcard "*" or a prefix; sorted.
	Allowed []string
	// Denied: a DENY WRITE ACL names exactly this topic, literally, for
	// any host (what DenyWrite creates); sorted.
	Denied []string
}

// TopicWriteACLs returns the writers of each of topics, from one
// DescribeAcls request for every topic ACL of the cluster (matched here
// as the authorizer matches them: AclAuthorizer/StandardAuthorizer), so a
// round costs one request whatever the number of topics. Errors wrap
// ErrNoAuthorizer, or a kwire.Error for a missing DESCRIBE on the cluster.
func (a *Admin) TopicWriteACLs(ctx context.Context, topics []string) (map[string]TopicWriters, error) {
	// An empty name is sent as null: any name (kafka-go writes an empty
	// nullable string as null).
	msg, err := a.cl.roundTrip(ctx, &describeacls.Request{Filter: describeacls.ACLFilter{
		ResourceTypeFilter: aclResourceTopic, ResourcePatternTypeFilter: aclPatternAny,
		Operation: aclOperationAny, PermissionType: aclPermissionAny,
	}})
	if err != nil {
		return nil, fmt.Errorf("describe topic ACLs on %s: %w", a.cl.Name, err)
	}
	res := msg.(*describeacls.Response)
	if err := aclError(res.ErrorCode, res.ErrorMessage, "describe topic ACLs on "+a.cl.Name); err != nil {
		return nil, err
	}
	out := make(map[string]TopicWriters, len(topics))
	for _, topic := range topics {
		var w TopicWriters
		for _, r := range res.Resources {
			if !aclMatches(r.PatternType, r.ResourceName, topic) {
				continue
			}
			for _, acl := range r.ACLs {
				switch {
				case acl.PermissionType == aclPermissionAllow && (acl.Operation == aclOperationWrite || acl.Operation == aclOperationAll):
					w.Allowed = append(w.Allowed, acl.Principal)
				case acl.PermissionType == aclPermissionDeny && acl.Operation == aclOperationWrite &&
					r.PatternType == aclPatternLiteral && r.ResourceName == topic && acl.Host == "*":
					w.Denied = append(w.Denied, acl.Principal)
				}
			}
		}
		slices.Sort(w.Allowed)
		slices.Sort(w.Denied)
		w.Allowed, w.Denied = slices.Compact(w.Allowed), slices.Compact(w.Denied)
		out[topic] = w
	}
	return out, nil
}

// aclMatches says whether an ACL resource pattern applies to topic: a
// literal name, the literal wildcard "*", or a prefix (KIP-290).
func aclMatches(patternType int8, name, topic string) bool {
	switch patternType {
	case aclPatternLiteral:
		return name == topic || name == "*"
	case aclPatternPrefixed:
		return strings.HasPrefix(topic, name)
	}
	return false
}

// DenyWrite adds DENY WRITE ACLs on topic (literal, any host) for each
// principal. Adding an ACL that exists already is a no-op.
func (a *Admin) DenyWrite(ctx context.Context, topic string, principals []string) error {
	if len(principals) == 0 {
		return nil
	}
	req := &createacls.Request{}
	for _, p := range principals {
		req.Creations = append(req.Creations, createacls.RequestACLs{
			ResourceType: aclResourceTopic, ResourceName: topic, ResourcePatternType: aclPatternLiteral,
			Principal: p, Host: "*", Operation: aclOperationWrite, PermissionType: aclPermissionDeny,
		})
	}
	msg, err := a.cl.roundTrip(ctx, req)
	if err != nil {
		return fmt.Errorf("create DENY WRITE ACLs on topic %s on %s: %w", topic, a.cl.Name, err)
	}
	for _, r := range msg.(*createacls.Response).Results {
		if err := aclError(r.ErrorCode, r.ErrorMessage, "create DENY WRITE ACLs on topic "+topic+" on "+a.cl.Name); err != nil {
			return err
		}
	}
	return nil
}

// RemoveDenyWrite deletes the DENY WRITE ACLs DenyWrite added for each
// principal; a missing one is not an error.
func (a *Admin) RemoveDenyWrite(ctx context.Context, topic string, principals []string) error {
	if len(principals) == 0 {
		return nil
	}
	req := &deleteacls.Request{}
	for _, p := range principals {
		req.Filters = append(req.Filters, deleteacls.RequestFilter{
			ResourceTypeFilter: aclResourceTopic, ResourceNameFilter: topic, ResourcePatternTypeFilter: aclPatternLiteral,
			PrincipalFilter: p, HostFilter: "*", Operation: aclOperationWrite, PermissionType: aclPermissionDeny,
		})
	}
	msg, err := a.cl.roundTrip(ctx, req)
	if err != nil {
		return fmt.Errorf("delete DENY WRITE ACLs on topic %s on %s: %w", topic, a.cl.Name, err)
	}
	for _, r := range msg.(*deleteacls.Response).FilterResults {
		if err := aclError(r.ErrorCode, r.ErrorMessage, "delete DENY WRITE ACLs on topic "+topic+" on "+a.cl.Name); err != nil {
			return err
		}
	}
	return nil
}

func aclError(code int16, message, op string) error {
	switch code {
	case 0:
		return nil
	case codeSecurityDisabled:
		return fmt.Errorf("%s: %w", op, ErrNoAuthorizer)
	}
	err := &kwire.Error{Code: code, Partition: -1, Op: op}
	if message != "" {
		return fmt.Errorf("%w (%s)", err, message)
	}
	return err
}
