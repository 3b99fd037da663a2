package ksec

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"strings"
)

// ParseProperties reads a Kafka-style .properties file: "key=value" or
// "key: value" lines, with keys and values trimmed; blank lines and lines
// starting with # or ! are skipped; a line ending in a backslash continues on
// the next one (as in the sasl.jaas.config examples of the Kafka docs).
// Other backslash escapes are kept as written. Malformed lines and duplicate
// keys are errors naming the line.
func ParseProperties(r io.Reader) (map[string]string, error) {
	props := make(map[string]string)
	firstLine := make(map[string]int)
	scanner := bufio.NewScanner(r)
	scanner.Buffer(make([]byte, 64*1024), 1024*1024)
	lineNo, start := 0, 0
	var logical strings.Builder
	for scanner.Scan() {
		lineNo++
		text := strings.TrimSpace(scanner.Text())
		if logical.Len() == 0 {
			if text == "" || text[0] == '#' || text[0] == '!' {
				continue
			}
			start = lineNo
		}
		if continues(text) {
			logical.WriteString(text[:len(text)-1])
			continue
		}
		logical.WriteString(text)
		if err := addProperty(props, firstLine, logical.String(), start); err != nil {
			return nil, err
		}
		logical.Reset()
	}
	if err := scanner.Err(); err != nil {
		if errors.Is(err, bufio.ErrTooLong) {
			return nil, fmt.Errorf("line %d: longer than 1 MiB", lineNo+1)
		}
		return nil, fmt.Errorf("line %d: %w", lineNo+1, err)
	}
	if logical.Len() > 0 {
		if err := addProperty(props, firstLine, logical.String(), start); err != nil {
			return nil, err
		}
	}
	return props, nil
}

// continues reports whether a line ends in an odd number of backslashes,
// that is in a backslash that is not itself escaped.
func continues(line string) bool {
	n := 0
	for n < len(line) && line[len(line)-1-n] == '\\' {
		n++
	}
	return n%2 == 1
}

func addProperty(props map[string]string, firstLine map[string]int, text string, line int) error {
	sep := strings.IndexAny(text, "=:")
	if sep < 0 {
		// The text is not quoted: it may be part of a secret (a JAAS
		// value whose continuation backslash is missing).
		return fmt.Errorf("line %d: is not key=value or key: value (the line is not shown: it may hold a secret; a multi-line value needs a backslash at the end of each line but the last)", line)
	}
	key, value := strings.TrimSpace(text[:sep]), strings.TrimSpace(text[sep+1:])
	if key == "" {
		return fmt.Errorf("line %d: has no key before %q", line, string(text[sep]))
	}
	if strings.ContainsAny(key, " \t") {
		return fmt.Errorf("line %d: key %q contains whitespace", line, key)
	}
	if first, ok := firstLine[key]; ok {
		return fmt.Errorf("line %d: duplicate key %q (first set on line %d): keep one", line, key, first)
	}
	firstLine[key] = line
	props[key] = value
	return nil
}
