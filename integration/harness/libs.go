package harness

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
)

var (
	homesMu sync.Mutex
	// homes maps a requested version ("" = the pinned default) to its
	// assembled Kafka folder; only successes are remembered.
	homes = map[string]string{}
)

// Libs ensures the Kafka jars for KAFKA_VERSION (or the version pinned in
// integration/kafka/assemble.sh) are assembled and returns their folder.
// The script serialises parallel callers, including other test binaries,
// with a file lock in the cache folder.
func Libs() (string, error) {
	home, err := kafkaHome("")
	if err != nil {
		return "", err
	}
	return filepath.Join(home, "libs"), nil
}

// kafkaHome runs assemble.sh (fast when already assembled) and returns the
// folder holding libs/ and log4j2.properties.
func kafkaHome(version string) (string, error) {
	homesMu.Lock()
	defer homesMu.Unlock()
	if home, ok := homes[version]; ok {
		return home, nil
	}
	root, err := repoRoot()
	if err != nil {
		return "", err
	}
	script := filepath.Join(root, "integration", "kafka", "assemble.sh")
	cmd := exec.Command("bash", script)
	cmd.Env = os.Environ()
	if version != "" {
		cmd.Env = append(cmd.Env, "KAFKA_VERSION="+version)
	}
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("assembling Kafka with %s failed (%v):\n%s", script, err, strings.TrimSpace(stderr.String()))
	}
	lines := strings.Fields(stdout.String())
	if len(lines) == 0 {
		return "", fmt.Errorf("%s printed no Kafka folder; stderr:\n%s", script, stderr.String())
	}
	home := lines[len(lines)-1]
	homes[version] = home
	return home, nil
}

// repoRoot finds the kmirror checkout: upwards from the working directory
// (tests run in their package folder), else from this source file.
func repoRoot() (string, error) {
	const marker = "integration/kafka/assemble.sh"
	var starts []string
	if wd, err := os.Getwd(); err == nil {
		starts = append(starts, wd)
	}
	if _, file, _, ok := runtime.Caller(0); ok {
		starts = append(starts, filepath.Dir(file))
	}
	for _, dir := range starts {
		for {
			if _, err := os.Stat(filepath.Join(dir, marker)); err == nil {
				return dir, nil
			}
			parent := filepath.Dir(dir)
			if parent == dir {
				break
			}
			dir = parent
		}
	}
	return "", errors.New("cannot find the kmirror repository (no " + marker + " above the working directory): run from inside the checkout")
}
