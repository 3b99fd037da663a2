// Package dist tests make dist (issue 22, section 6): the Debian package
// installs into a clean root with dpkg -i, its maintainer script creates
// the kmirror user and folders there, and systemd-analyze verify passes on
// its unit; the tarball holds what a manual install needs.
package dist

import (
	"archive/tar"
	"compress/gzip"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

func run(t *testing.T, dir, name string, args ...string) string {
	t.Helper()
	cmd := exec.Command(name, args...)
	cmd.Dir = dir
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
	}
	return string(out)
}

func TestDist(t *testing.T) {
	for _, tool := range []string{"dpkg", "dpkg-deb", "systemd-analyze"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Fatalf("%s is not installed (apt-get install dpkg systemd; .ci/run does)", tool)
		}
	}
	repo, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	const version = "0.1.0+test"
	run(t, repo, "make", "dist", "VERSION="+version)
	deb := filepath.Join(repo, "dist", "kmirror_"+version+"_amd64.deb")
	tarball := filepath.Join(repo, "dist", "kmirror-"+version+"-linux-amd64.tar.gz")

	contents := run(t, repo, "dpkg-deb", "--contents", deb)
	for _, f := range []string{"./usr/bin/kmirror", "./usr/lib/systemd/system/kmirror.service", "./usr/lib/sysusers.d/kmirror.conf",
		"./usr/lib/tmpfiles.d/kmirror.conf", "./usr/share/kmirror/kmirror.example.yaml", "./usr/share/kmirror/prometheus/kmirror-rules.yml"} {
		if !strings.Contains(contents, f) {
			t.Errorf("the package lacks %s:\n%s", f, contents)
		}
	}

	// A clean root: an empty dpkg database, nothing else. The maintainer
	// scripts run outside it with DPKG_ROOT set.
	root := t.TempDir()
	for _, d := range []string{"var/lib/dpkg/info", "var/lib/dpkg/updates", "var/lib/dpkg/triggers", "etc"} {
		if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for _, f := range []string{"var/lib/dpkg/status", "var/lib/dpkg/available"} {
		if err := os.WriteFile(filepath.Join(root, f), nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	run(t, repo, "dpkg", "--root="+root, "--force-script-chrootless", "--log=/dev/null", "-i", deb)
	status := run(t, repo, "dpkg", "--root="+root, "-s", "kmirror")
	if !strings.Contains(status, "Status: install ok installed") || !strings.Contains(status, "Version: "+version) {
		t.Fatalf("dpkg -s kmirror in the root:\n%s", status)
	}
	if out := run(t, root, filepath.Join(root, "usr/bin/kmirror"), "version"); !strings.Contains(out, "kmirror "+version) {
		t.Fatalf("the installed binary says %q", out)
	}
	passwd, err := os.ReadFile(filepath.Join(root, "etc/passwd"))
	if err != nil || !strings.Contains(string(passwd), "kmirror:") {
		t.Fatalf("postinst made no kmirror user in the root's /etc/passwd (%v):\n%s", err, passwd)
	}
	for _, d := range []string{"var/lib/kmirror", "etc/kmirror/hooks"} {
		if fi, err := os.Stat(filepath.Join(root, d)); err != nil || !fi.IsDir() {
			t.Errorf("postinst made no /%s: %v", d, err)
		}
	}
	unit := filepath.Join(root, "usr/lib/systemd/system/kmirror.service")
	if b, err := os.ReadFile(unit); err != nil || !strings.Contains(string(b), "ExecStart=/usr/bin/kmirror daemon") {
		t.Fatalf("the packaged unit does not run /usr/bin/kmirror: %v\n%s", err, b)
	}
	// systemd-analyze verify checks the unit against the root's units
	// (the targets it names) and binary: systemd's own units are copied
	// in, as the systemd package the kmirror package recommends would
	// install them. A warning (an unknown key) fails the test too.
	if _, err := os.Stat("/usr/lib/systemd/system/kmirror.service"); err == nil {
		t.Fatal("this machine has a kmirror.service of its own in /usr/lib/systemd/system: the copy would replace the package's")
	}
	run(t, repo, "cp", "-a", "/usr/lib/systemd/system/.", filepath.Join(root, "usr/lib/systemd/system/"))
	if out := run(t, repo, "systemd-analyze", "verify", "--root="+root, "kmirror.service"); strings.TrimSpace(out) != "" {
		t.Fatalf("systemd-analyze verify of the packaged unit warns:\n%s", out)
	}

	// The tarball: the binary, the unit, the example config, the rules.
	f, err := os.Open(tarball)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	gz, err := gzip.NewReader(f)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	tr := tar.NewReader(gz)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		names = append(names, h.Name)
	}
	for _, want := range []string{"kmirror", "kmirror.service", "kmirror.example.yaml", "kmirror-rules.yml", "sysusers.conf", "tmpfiles.conf", "README.md", "deploy.md"} {
		if !slices.Contains(names, "kmirror-"+version+"-linux-amd64/"+want) {
			t.Errorf("the tarball lacks %s: %v", want, names)
		}
	}
}
