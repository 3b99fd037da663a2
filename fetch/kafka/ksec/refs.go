package ksec

import (
	"fmt"
	"os"
	"regexp"
	"strings"
)

// reference matches a config-provider reference as Kafka's ConfigTransformer
// does (KIP-297): ${provider:path:key} or ${provider:key}.
var reference = regexp.MustCompile(`\$\{([^}]*?):(([^}]*?):)?([^}]*?)\}`)

// HasReference reports whether v holds a ${...} reference.
func HasReference(v string) bool { return reference.MatchString(v) }

// checkReferences checks the references in v without reading files: only
// the file provider is known.
func checkReferences(key, v string) error {
	for _, m := range reference.FindAllStringSubmatch(v, -1) {
		if m[1] != "file" {
			return fmt.Errorf("%s: reference %s uses config provider %q: kmirror supports only ${file:/path/to/file:key} "+
				"(Kafka's FileConfigProvider) and ${file:/path/to/file}", key, m[0], m[1])
		}
	}
	return nil
}

// resolveReferences replaces every reference in v with what it names:
//   - ${file:/path:key} is key in the properties file at path, as Kafka's
//     FileConfigProvider reads it;
//   - ${file:/path} is the whole file without its trailing line break
//     (kmirror's extension, for a secret kept alone in a file).
//
// Errors name the key, the file and the missing entry, never a value.
func resolveReferences(key, v string) (string, error) {
	var firstErr error
	out := reference.ReplaceAllStringFunc(v, func(ref string) string {
		m := reference.FindStringSubmatch(ref)
		if m[1] != "file" {
			firstErr = fmt.Errorf("%s: reference %s uses config provider %q: kmirror supports only ${file:...}", key, ref, m[1])
			return ""
		}
		path, entry := m[3], m[4]
		if m[2] == "" {
			path, entry = m[4], ""
		}
		data, err := os.ReadFile(path)
		if err != nil {
			firstErr = fmt.Errorf("%s: reference %s: %v: the file must exist and be readable by kmirror on every member", key, ref, err)
			return ""
		}
		if entry == "" {
			return strings.TrimRight(string(data), "\r\n")
		}
		props, err := ParseProperties(strings.NewReader(string(data)))
		if err != nil {
			// The parser's message quotes the line, which may hold a secret.
			firstErr = fmt.Errorf("%s: reference %s: %s is not a properties file (key=value lines)", key, ref, path)
			return ""
		}
		val, ok := props[entry]
		if !ok {
			firstErr = fmt.Errorf("%s: reference %s: %s has no key %q", key, ref, path, entry)
			return ""
		}
		return val
	})
	if firstErr != nil {
		return "", firstErr
	}
	return out, nil
}
