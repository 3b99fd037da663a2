package ksec

import (
	"reflect"
	"strings"
	"testing"
)

func TestParseProperties(t *testing.T) {
	input := `# source cluster A
! also a comment

bootstrap.servers=a1:9092,a2:9092
security.protocol : SASL_SSL
  sasl.mechanism=PLAIN
empty.value=
url=http://example.com:8080/x=y
sasl.jaas.config=org.apache.kafka.common.security.plain.PlainLoginModule required \
    username="alice" \
    password="a\\b";
path=C:\\certs
`
	got, err := ParseProperties(strings.NewReader(input))
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{
		"bootstrap.servers": "a1:9092,a2:9092",
		"security.protocol": "SASL_SSL",
		"sasl.mechanism":    "PLAIN",
		"empty.value":       "",
		"url":               "http://example.com:8080/x=y",
		"sasl.jaas.config":  `org.apache.kafka.common.security.plain.PlainLoginModule required username="alice" password="a\\b";`,
		"path":              `C:\\certs`,
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("got  %q\nwant %q", got, want)
	}
}

func TestParsePropertiesErrors(t *testing.T) {
	tests := []struct {
		name, input, want string
	}{
		{"no separator", "a=1\n\njust words\n", `line 3: is not key=value or key: value (the line is not shown`},
		{"no key", "# c\n=value\n", `line 2: has no key before "="`},
		{"space in key", "a b=1\n", `line 1: key "a b" contains whitespace`},
		{"duplicate", "a=1\nb=2\na = 3\n", `line 3: duplicate key "a" (first set on line 1): keep one`},
		{"duplicate after continuation", "a=1 \\\n 2\na=3\n", `line 3: duplicate key "a" (first set on line 1)`},
		{"continued to end", "a=1\nbroken \\\n", `line 2: is not key=value`},
		{"too long", "a=" + strings.Repeat("x", 2<<20) + "\n", "line 1: longer than 1 MiB"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := ParseProperties(strings.NewReader(tt.input))
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("got %v, want %q", err, tt.want)
			}
		})
	}
}
