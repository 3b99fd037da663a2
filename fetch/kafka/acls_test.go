package kafka

import "testing"

// TestACLMatches: which resource patterns of a DescribeAcls answer apply
// to a topic (the authorizer's rule; KIP-290 prefixes).
func TestACLMatches(t *testing.T) {
	for _, c := range []struct {
		pattern     int8
		name, topic string
		want        bool
	}{
		{aclPatternLiteral, "orders", "orders", true},
		{aclPatternLiteral, "orders", "orders-eu", false},
		{aclPatternLiteral, "*", "orders", true},
		{aclPatternPrefixed, "ord", "orders", true},
		{aclPatternPrefixed, "orders-", "orders", false},
		{aclPatternPrefixed, "*", "orders", false}, // a prefixed "*" is a literal prefix
		{aclPatternAny, "orders", "orders", false}, // never a pattern type of an ACL itself
	} {
		if got := aclMatches(c.pattern, c.name, c.topic); got != c.want {
			t.Errorf("aclMatches(%d, %q, %q) = %v, want %v", c.pattern, c.name, c.topic, got, c.want)
		}
	}
}
