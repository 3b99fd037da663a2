package ksec

import (
	"fmt"
	"strings"
	"unicode"
)

// jaasEntry is one login module entry of sasl.jaas.config:
// "<module class> <flag> key=value ... ;" (JAAS configuration syntax, as
// Kafka's JaasConfig reads it).
type jaasEntry struct {
	module  string
	flag    string
	options map[string]string
	order   []string // option keys as written
}

// JAAS login modules kmirror understands, by the SASL mechanism they serve.
const (
	plainModule = "org.apache.kafka.common.security.plain.PlainLoginModule"
	scramModule = "org.apache.kafka.common.security.scram.ScramLoginModule"
)

// parseJAAS reads a sasl.jaas.config value. Errors say where the text went
// wrong by position and never quote it: it holds a password.
func parseJAAS(s string) (jaasEntry, error) {
	t := jaasTokens{s: s}
	var e jaasEntry
	var err error
	if e.module, err = t.word("the login module class, such as " + scramModule); err != nil {
		return e, err
	}
	if e.flag, err = t.word("the control flag required"); err != nil {
		return e, err
	}
	switch strings.ToLower(e.flag) {
	case "required", "requisite", "sufficient", "optional":
	default:
		return e, fmt.Errorf("sasl.jaas.config: the control flag after the login module must be required (found a word of %d characters)", len(e.flag))
	}
	e.options = map[string]string{}
	for {
		t.space()
		if t.peek() == ';' {
			t.i++
			break
		}
		if t.done() {
			return e, fmt.Errorf("sasl.jaas.config: ends without ';': close the entry with a semicolon")
		}
		key, err := t.word("an option name such as username")
		if err != nil {
			return e, err
		}
		t.space()
		if t.peek() != '=' {
			return e, fmt.Errorf("sasl.jaas.config: option %s has no '=' after it: write %s=\"value\"", key, key)
		}
		t.i++
		val, err := t.value(key)
		if err != nil {
			return e, err
		}
		if _, dup := e.options[key]; dup {
			return e, fmt.Errorf("sasl.jaas.config: option %s is given twice: keep one", key)
		}
		e.options[key] = val
		e.order = append(e.order, key)
	}
	t.space()
	if !t.done() {
		return e, fmt.Errorf("sasl.jaas.config: text after the first entry's ';': kmirror's client uses exactly one login module entry")
	}
	return e, nil
}

type jaasTokens struct {
	s string
	i int
}

func (t *jaasTokens) done() bool { return t.i >= len(t.s) }

func (t *jaasTokens) peek() byte {
	if t.done() {
		return 0
	}
	return t.s[t.i]
}

func (t *jaasTokens) space() {
	for !t.done() && unicode.IsSpace(rune(t.s[t.i])) {
		t.i++
	}
}

// word reads an unquoted token (a class name, flag or option name).
func (t *jaasTokens) word(what string) (string, error) {
	t.space()
	start := t.i
	for !t.done() && !unicode.IsSpace(rune(t.s[t.i])) && t.s[t.i] != '=' && t.s[t.i] != ';' && t.s[t.i] != '"' {
		t.i++
	}
	if t.i == start {
		return "", fmt.Errorf("sasl.jaas.config: expected %s at character %d", what, t.i+1)
	}
	return t.s[start:t.i], nil
}

// value reads an option value: a double-quoted string (backslash escapes
// the next character) or an unquoted word.
func (t *jaasTokens) value(key string) (string, error) {
	t.space()
	if t.peek() != '"' {
		v, err := t.word("a value for option " + key)
		return v, err
	}
	t.i++
	var b strings.Builder
	for !t.done() {
		c := t.s[t.i]
		t.i++
		switch c {
		case '\\':
			if t.done() {
				return "", fmt.Errorf("sasl.jaas.config: the value of option %s ends in a backslash", key)
			}
			b.WriteByte(t.s[t.i])
			t.i++
		case '"':
			return b.String(), nil
		default:
			b.WriteByte(c)
		}
	}
	return "", fmt.Errorf("sasl.jaas.config: the value of option %s has no closing quote", key)
}

// redactJAAS shows a sasl.jaas.config with every option but username
// hidden, unless the option is a ${file:...} reference.
func redactJAAS(v string) string {
	e, err := parseJAAS(v)
	if err != nil {
		return hidden
	}
	var b strings.Builder
	b.WriteString(e.module + " " + e.flag)
	for _, k := range e.order {
		val := e.options[k]
		if k != "username" && !isOnlyReferences(val) {
			val = hidden
		}
		fmt.Fprintf(&b, " %s=%q", k, val)
	}
	b.WriteString(";")
	return b.String()
}
