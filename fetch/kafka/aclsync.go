package kafka

import (
	"context"
	"fmt"
	"sort"

	"github.com/segmentio/kafka-go/protocol/createacls"
	"github.com/segmentio/kafka-go/protocol/deleteacls"
	"github.com/segmentio/kafka-go/protocol/describeacls"
)

// ACL is one ACL binding (Kafka's AclBinding: a resource pattern and an
// access control entry), with the protocol's enum values.
type ACL struct {
	ResourceType int8   `json:"resource_type"` // 2 topic, 3 group
	Name         string `json:"name"`
	PatternType  int8   `json:"pattern_type"` // 3 literal, 4 prefixed
	Principal    string `json:"principal"`
	Host         string `json:"host"`
	Operation    int8   `json:"operation"`  // 2 all, 3 read, 4 write, ...
	Permission   int8   `json:"permission"` // 2 deny, 3 allow
}

// ACL enums beyond acls.go's.
const (
	ACLResourceTopic int8 = aclResourceTopic
	ACLResourceGroup int8 = 3
	ACLLiteral       int8 = aclPatternLiteral
	ACLOperationAll  int8 = aclOperationAll
	ACLOperationRead int8 = 3
	ACLWrite         int8 = aclOperationWrite
	ACLAllow         int8 = aclPermissionAllow
	ACLDeny          int8 = aclPermissionDeny
)

func (a ACL) String() string {
	perm := "ALLOW"
	if a.Permission == ACLDeny {
		perm = "DENY"
	}
	kind := map[int8]string{ACLResourceTopic: "topic", ACLResourceGroup: "group"}[a.ResourceType]
	return fmt.Sprintf("%s %s op=%d on %s %s (pattern %d) host %s", perm, a.Principal, a.Operation, kind, a.Name, a.PatternType, a.Host)
}

// ListACLs returns every ACL binding of resourceType (any name, pattern,
// principal, host, operation and permission), sorted. Errors wrap
// ErrNoAuthorizer, or a kwire.Error (a missing DESCRIBE on the cluster).
func (a *Admin) ListACLs(ctx context.Context, resourceType int8) ([]ACL, error) {
	msg, err := a.cl.roundTrip(ctx, &describeacls.Request{Filter: describeacls.ACLFilter{
		ResourceTypeFilter: resourceType, ResourcePatternTypeFilter: aclPatternAny,
		Operation: aclOperationAny, PermissionType: aclPermissionAny,
	}})
	if err != nil {
		return nil, fmt.Errorf("describe ACLs on %s: %w", a.cl.Name, err)
	}
	res := msg.(*describeacls.Response)
	if err := aclError(res.ErrorCode, res.ErrorMessage, "describe ACLs on "+a.cl.Name); err != nil {
		return nil, err
	}
	var out []ACL
	for _, r := range res.Resources {
		for _, e := range r.ACLs {
			out = append(out, ACL{ResourceType: r.ResourceType, Name: r.ResourceName, PatternType: r.PatternType,
				Principal: e.Principal, Host: e.Host, Operation: e.Operation, Permission: e.PermissionType})
		}
	}
	SortACLs(out)
	return out, nil
}

// SortACLs orders ACL bindings by all their fields.
func SortACLs(acls []ACL) {
	sort.Slice(acls, func(i, j int) bool {
		x, y := acls[i], acls[j]
		if x.ResourceType != y.ResourceType {
			return x.ResourceType < y.ResourceType
		}
		if x.Name != y.Name {
			return x.Name < y.Name
		}
		if x.PatternType != y.PatternType {
			return x.PatternType < y.PatternType
		}
		if x.Principal != y.Principal {
			return x.Principal < y.Principal
		}
		if x.Host != y.Host {
			return x.Host < y.Host
		}
		if x.Operation != y.Operation {
			return x.Operation < y.Operation
		}
		return x.Permission < y.Permission
	})
}

// CreateACLs creates the bindings (an existing one is a no-op).
func (a *Admin) CreateACLs(ctx context.Context, acls []ACL) error {
	if len(acls) == 0 {
		return nil
	}
	req := &createacls.Request{}
	for _, c := range acls {
		req.Creations = append(req.Creations, createacls.RequestACLs{ResourceType: c.ResourceType, ResourceName: c.Name,
			ResourcePatternType: c.PatternType, Principal: c.Principal, Host: c.Host, Operation: c.Operation, PermissionType: c.Permission})
	}
	msg, err := a.cl.roundTrip(ctx, req)
	if err != nil {
		return fmt.Errorf("create ACLs on %s: %w", a.cl.Name, err)
	}
	for i, r := range msg.(*createacls.Response).Results {
		if err := aclError(r.ErrorCode, r.ErrorMessage, fmt.Sprintf("create ACL %v on %s", acls[min(i, len(acls)-1)], a.cl.Name)); err != nil {
			return err
		}
	}
	return nil
}

// DeleteACLs deletes exactly the given bindings (each filter names every
// field); one already gone is not an error.
func (a *Admin) DeleteACLs(ctx context.Context, acls []ACL) error {
	if len(acls) == 0 {
		return nil
	}
	req := &deleteacls.Request{}
	for _, c := range acls {
		req.Filters = append(req.Filters, deleteacls.RequestFilter{ResourceTypeFilter: c.ResourceType, ResourceNameFilter: c.Name,
			ResourcePatternTypeFilter: c.PatternType, PrincipalFilter: c.Principal, HostFilter: c.Host, Operation: c.Operation,
			PermissionType: c.Permission})
	}
	msg, err := a.cl.roundTrip(ctx, req)
	if err != nil {
		return fmt.Errorf("delete ACLs on %s: %w", a.cl.Name, err)
	}
	for i, r := range msg.(*deleteacls.Response).FilterResults {
		if err := aclError(r.ErrorCode, r.ErrorMessage, fmt.Sprintf("delete ACL %v on %s", acls[min(i, len(acls)-1)], a.cl.Name)); err != nil {
			return err
		}
	}
	return nil
}
