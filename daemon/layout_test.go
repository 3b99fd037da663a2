package daemon

import (
	"go/parser"
	"go/token"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestPackagesImportOneWay keeps the layout's import directions (issue 17,
// README Layout): the API contract, the config, the mirror properties,
// the HTTP server, the operator verbs and the leader's and the owners'
// duties import nothing of the daemon (nor the duties each other); the data path imports neither the daemon nor
// raftstore; cluster access imports no data path.
func TestPackagesImportOneWay(t *testing.T) {
	const mod = "github.com/kmirror/kmirror/"
	out, err := exec.Command("go", "list", "-f", `{{.ImportPath}}{{range .Deps}} {{.}}{{end}}`, "../...").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	deps := map[string]map[string]bool{}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		f := strings.Fields(line)
		set := map[string]bool{}
		for _, d := range f[1:] {
			set[strings.TrimPrefix(d, mod)] = true
		}
		deps[strings.TrimPrefix(f[0], mod)] = set
	}
	for _, rule := range []struct {
		pkg    string
		forbid []string
	}{
		{"daemon/api", []string{"daemon", "daemon/config", "daemon/httpapi", "daemon/leader", "daemon/owner", "daemon/ops", "daemon/mirrorprops", "raftstore"}},
		{"daemon/config", []string{"daemon", "daemon/api", "daemon/httpapi", "daemon/leader", "daemon/owner", "daemon/ops", "fetch"}},
		{"daemon/mirrorprops", []string{"daemon", "daemon/config", "daemon/httpapi", "daemon/leader", "daemon/owner", "daemon/ops"}},
		{"daemon/httpapi", []string{"daemon", "daemon/leader", "daemon/owner", "daemon/ops"}},
		{"daemon/leader", []string{"daemon", "daemon/httpapi", "daemon/owner", "daemon/ops"}},
		{"daemon/owner", []string{"daemon", "daemon/httpapi", "daemon/leader", "daemon/ops"}},
		{"daemon/ops", []string{"daemon", "daemon/httpapi", "daemon/leader", "daemon/owner"}},
		{"fetch", []string{"daemon", "daemon/api", "daemon/config", "raftstore", "truncate"}},
		{"fetch/kafka", []string{"fetch", "daemon", "raftstore", "truncate", "fetch/kafka/ksec"}},
		{"raftstore", []string{"daemon", "fetch", "fetch/kafka", "truncate"}},
	} {
		d, ok := deps[rule.pkg]
		if !ok {
			t.Fatalf("package %s not found by go list", rule.pkg)
		}
		for _, f := range rule.forbid {
			if d[f] {
				t.Errorf("%s imports %s (directly or not): the layout forbids it", rule.pkg, f)
			}
		}
	}
}

// TestCLIImportsTheContract: of the CLI's files only daemon.go (the
// kmirror daemon subcommand, which runs a member) imports the daemon; the
// commands use daemon/api.
func TestCLIImportsTheContract(t *testing.T) {
	files, err := filepath.Glob("../cmd/kmirror/*.go")
	if err != nil || len(files) == 0 {
		t.Fatalf("cmd/kmirror files: %v, %v", files, err)
	}
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") || filepath.Base(f) == "daemon.go" {
			continue
		}
		af, err := parser.ParseFile(token.NewFileSet(), f, nil, parser.ImportsOnly)
		if err != nil {
			t.Fatal(err)
		}
		for _, imp := range af.Imports {
			if imp.Path.Value == `"github.com/kmirror/kmirror/daemon"` {
				t.Errorf("%s imports the daemon: CLI commands use daemon/api", f)
			}
		}
	}
}
