package config

import (
	"fmt"
	"reflect"
	"regexp"
	"strconv"
	"strings"
	"time"

	"gopkg.in/yaml.v3"
)

// YAML decoding errors rewritten for operators: the field's path in the
// file, the value it got, and what it takes.

// typeErrorLine matches the "line N: " prefix yaml.v3 puts on each message
// of a TypeError.
var typeErrorLine = regexp.MustCompile(`^line (\d+): (.*)$`)

// unknownFieldMessage is yaml.v3's message for a key with no struct field.
var unknownFieldMessage = regexp.MustCompile(`^field (\S+) not found in type `)

// explainTypeErrors rewrites yaml.v3's messages, which name Go types, to name
// the config key on the reported line and what it accepts.
func explainTypeErrors(data []byte, typeErr *yaml.TypeError) error {
	var root yaml.Node
	if err := yaml.Unmarshal(data, &root); err != nil {
		return typeErr
	}
	var errs problems
	for _, msg := range typeErr.Errors {
		m := typeErrorLine.FindStringSubmatch(msg)
		if m == nil {
			errs = append(errs, msg)
			continue
		}
		line, _ := strconv.Atoi(m[1])
		unknown := unknownFieldMessage.FindStringSubmatch(m[2])
		name := ""
		if unknown != nil {
			name = unknown[1]
		}
		keys := keysAtLine(&root, line, name)
		if keys == nil {
			errs = append(errs, msg)
			continue
		}
		path, t := configField(keys)
		switch {
		case unknown != nil:
			field := name
			if path != "" {
				field = path + "." + name
			}
			errs = append(errs, fmt.Sprintf("line %d: unknown field %q (allowed here: %s)",
				line, field, strings.Join(yamlKeys(t), ", ")))
		case path == "":
			errs = append(errs, msg)
		default:
			errs = append(errs, fmt.Sprintf("line %d: %s: %s%s", line, path, m[2], typeHint(t)))
		}
	}
	return errs.err()
}

// keysAtLine returns the keys (and "[i]" sequence indexes) leading to the
// deepest key named name (any key if name is "") whose key or value starts
// on line, or nil if there is none. yaml.v3 reports lines only, so items of
// a one-line flow sequence are told apart only by their parent key.
func keysAtLine(n *yaml.Node, line int, name string) []string {
	switch n.Kind {
	case yaml.DocumentNode:
		for _, c := range n.Content {
			if p := keysAtLine(c, line, name); p != nil {
				return p
			}
		}
	case yaml.MappingNode:
		for i := 0; i+1 < len(n.Content); i += 2 {
			key, value := n.Content[i], n.Content[i+1]
			if p := keysAtLine(value, line, name); p != nil {
				return append([]string{key.Value}, p...)
			}
			if (name == "" || key.Value == name) && (key.Line == line || value.Line == line) {
				return []string{key.Value}
			}
		}
	case yaml.SequenceNode:
		if name == "" && itemsOnLine(n, line) > 1 {
			return []string{} // a flow sequence: the item is unknown
		}
		for i, c := range n.Content {
			index := fmt.Sprintf("[%d]", i)
			if p := keysAtLine(c, line, name); p != nil {
				return append([]string{index}, p...)
			}
			if name == "" && c.Line == line {
				return []string{index}
			}
		}
	}
	return nil
}

func itemsOnLine(seq *yaml.Node, line int) int {
	n := 0
	for _, c := range seq.Content {
		if c.Line == line {
			n++
		}
	}
	return n
}

// configField follows keys through Config as far as they name fields and
// returns that part as a path, such as "destination.bootstrap_servers[1]",
// with the Go type found there.
func configField(keys []string) (string, reflect.Type) {
	t := reflect.TypeOf(Config{})
	var path strings.Builder
	for _, key := range keys {
		switch {
		case t.Kind() == reflect.Struct:
			f, ok := yamlField(t, key)
			if !ok {
				return path.String(), t
			}
			if path.Len() > 0 {
				path.WriteByte('.')
			}
			path.WriteString(key)
			t = f.Type
		case t.Kind() == reflect.Slice && strings.HasPrefix(key, "["):
			path.WriteString(key)
			t = t.Elem()
		default:
			return path.String(), t
		}
	}
	return path.String(), t
}

// yamlKeys lists the keys of the struct type t.
func yamlKeys(t reflect.Type) []string {
	keys := make([]string, 0, t.NumField())
	for i := 0; i < t.NumField(); i++ {
		if name := yamlName(t.Field(i)); name != "" {
			keys = append(keys, name)
		}
	}
	return keys
}

// typeHint says what a field of type t accepts where yaml.v3's message
// names only the Go type.
func typeHint(t reflect.Type) string {
	switch t {
	case reflect.TypeOf(time.Duration(0)):
		return " (want a duration such as 500ms, 1s or 2m)"
	case reflect.TypeOf(int16(0)):
		return " (want a whole number from -32768 to 32767)"
	case reflect.TypeOf([]string(nil)):
		return " (want a list such as [\"host1:9092\", \"host2:9092\"])"
	}
	return ""
}

func yamlField(t reflect.Type, name string) (reflect.StructField, bool) {
	for i := 0; i < t.NumField(); i++ {
		if yamlName(t.Field(i)) == name {
			return t.Field(i), true
		}
	}
	return reflect.StructField{}, false
}

func yamlName(f reflect.StructField) string {
	name, _, _ := strings.Cut(f.Tag.Get("yaml"), ",")
	return name
}
