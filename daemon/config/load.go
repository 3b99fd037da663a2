package config

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"

	"gopkg.in/yaml.v3"
)

// Load reads the YAML file at path over DefaultConfig, applies the
// derived defaults and validates the result. Unknown fields are errors.
func Load(path string) (Config, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return Config{}, fmt.Errorf("read config: %w", err)
	}
	cfg, err := parseConfig(data)
	if err != nil {
		return Config{}, fmt.Errorf("config %s: %w", path, err)
	}
	return cfg, nil
}

func parseConfig(data []byte) (Config, error) {
	cfg, err := parseConfigLines(data)
	if err != nil && strings.Contains(err.Error(), "\n") {
		// yaml.v3 quotes a multi-line value as it is: keep every error on
		// one line, as the CLI prints it.
		return Config{}, errors.New(strings.ReplaceAll(err.Error(), "\n", `\n`))
	}
	return cfg, err
}

func parseConfigLines(data []byte) (Config, error) {
	cfg := DefaultConfig()
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	if err := dec.Decode(&cfg); err != nil {
		if errors.Is(err, io.EOF) {
			return Config{}, errors.New("file is empty: set at least node_id, data_dir and destination.bootstrap_servers")
		}
		var typeErr *yaml.TypeError
		if errors.As(err, &typeErr) {
			return Config{}, explainTypeErrors(data, typeErr)
		}
		return Config{}, err
	}
	if err := fractionalCounts(data); err != nil {
		return Config{}, err
	}
	var extra yaml.Node
	if err := dec.Decode(&extra); !errors.Is(err, io.EOF) {
		return Config{}, errors.New("holds more than one YAML document: keep only one")
	}
	cfg.ApplyDefaults()
	if err := unknownDestinationKeys(data, cfg.Destination); err != nil {
		return Config{}, err
	}
	if err := cfg.Validate(); err != nil {
		return Config{}, err
	}
	return cfg, nil
}

// countKeys are the settings that are whole numbers: yaml.v3 decodes
// produce_window: 2.5 into an int as 2 without a word (review), so a
// fraction there is refused here with its line.
var countKeys = map[string]string{
	"produce_window":     "use a whole number from 1 to 5",
	"replication_factor": "use a whole number: -1 (the broker's default) or 1 to 32767",
}

// fractionalCounts reports a count key whose value is not a whole number.
func fractionalCounts(data []byte) error {
	var root yaml.Node
	if err := yaml.Unmarshal(data, &root); err != nil {
		return nil // Decode reported it
	}
	var errs problems
	var walk func(n *yaml.Node, path string)
	walk = func(n *yaml.Node, path string) {
		for _, c := range n.Content {
			if n.Kind != yaml.MappingNode {
				walk(c, path)
			}
		}
		if n.Kind != yaml.MappingNode {
			return
		}
		for i := 0; i+1 < len(n.Content); i += 2 {
			k, v := n.Content[i], n.Content[i+1]
			name := strings.TrimPrefix(path+"."+k.Value, ".")
			if hint, ok := countKeys[k.Value]; ok && v.Kind == yaml.ScalarNode && v.Tag != "!!int" {
				errs = append(errs, fmt.Sprintf("line %d: %s: %s is not a whole number: %s", v.Line, name, v.Value, hint))
			}
			walk(v, name)
		}
	}
	walk(&root, "")
	return errs.err()
}
