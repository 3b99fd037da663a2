package fetch

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/segmentio/kafka-go/protocol/createacls"
	"github.com/segmentio/kafka-go/protocol/deleteacls"
	"github.com/segmentio/kafka-go/protocol/describeacls"

	"github.com/kmirror/kmirror/fetch/kwire"
)

// ACL enums of the Kafka protocol (org.apache.kafka.common.acl and
// org.apache.kafka.common.resource).
const (
	aclResourceTopic   int8 = 2
	aclPatternMatch    int8 = 2
	aclPatternLiteral  int8 = 3
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

// TopicWriteACLs returns, sorted, the principals that an ALLOW ACL lets
// write topic (WRITE or ALL on the topic by a literal, prefixed or
// wildcard pattern) and those with a DENY WRITE ACL on exactly this topic
// (what DenyWrite creates). Errors wrap ErrNoAuthorizer, or a kwire.Error
// for a missing DESCRIBE on the cluster.
func (a *Admin) TopicWriteACLs(ctx context.Context, topic string) (allowed, denied []string, err error) {
	msg, err := a.cl.roundTrip(ctx, &describeacls.Request{Filter: describeacls.ACLFilter{
		ResourceTypeFilter: aclResourceTopic, ResourceNameFilter: topic, ResourcePatternTypeFilter: aclPatternMatch,
		Operation: aclOperationAny, PermissionType: aclPermissionAny,
	}})
	if err != nil {
		return nil, nil, fmt.Errorf("describe ACLs of topic %s on %s: %w", topic, a.cl.name, err)
	}
	res := msg.(*describeacls.Response)
	if err := aclError(res.ErrorCode, res.ErrorMessage, "describe ACLs of topic "+topic+" on "+a.cl.name); err != nil {
		return nil, nil, err
	}
	for _, r := range res.Resources {
		for _, acl := range r.ACLs {
			switch {
			case acl.PermissionType == aclPermissionAllow && (acl.Operation == aclOperationWrite || acl.Operation == aclOperationAll):
				allowed = append(allowed, acl.Principal)
			case acl.PermissionType == aclPermissionDeny && acl.Operation == aclOperationWrite &&
				r.PatternType == aclPatternLiteral && r.ResourceName == topic && acl.Host == "*":
				denied = append(denied, acl.Principal)
			}
		}
	}
	slices.Sort(allowed)
	slices.Sort(denied)
	return slices.Compact(allowed), slices.Compact(denied), nil
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
		return fmt.Errorf("create DENY WRITE ACLs on topic %s on %s: %w", topic, a.cl.name, err)
	}
	for _, r := range msg.(*createacls.Response).Results {
		if err := aclError(r.ErrorCode, r.ErrorMessage, "create DENY WRITE ACLs on topic "+topic+" on "+a.cl.name); err != nil {
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
		return fmt.Errorf("delete DENY WRITE ACLs on topic %s on %s: %w", topic, a.cl.name, err)
	}
	for _, r := range msg.(*deleteacls.Response).FilterResults {
		if err := aclError(r.ErrorCode, r.ErrorMessage, "delete DENY WRITE ACLs on topic "+topic+" on "+a.cl.name); err != nil {
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
