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
