// Package config is a kmirror member's configuration file: the schema with
// its defaults (Config), loading (Load), YAML errors rewritten to name the
// field and what it takes, and validation that reports every invalid field
// at once, the api and raft_tls sections included (certificates must hold
// the hosts other members reach this member by).
//
// It reads files and parses; it starts nothing and imports nothing of the
// daemon. deploy/kmirror.example.yaml is kept in step with it by
// TestExampleConfigLoads.
package config
