package integration

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/kmirror/kmirror/daemon/api"
)

// TestStatusPage (issue 22, section 3): headless Chromium (Debian's
// chromium, installed by .ci/run) loads a live member's /ui, with the API
// token as the Basic password as a browser sends it, and the rendered DOM
// holds every partition of the mirrored topic, a DIVERGED one shown as
// such with its reason, the member, and a lag chart drawn from the
// member's samples. The screenshot is kept in .cache/artifacts/ui.png.
func TestStatusPage(t *testing.T) {
	browser, err := exec.LookPath("chromium")
	if err != nil {
		t.Fatal("chromium is not installed: apt-get install chromium (.ci/run does)")
	}
	const token = "status-page-token-0123456789"
	tokenFile := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(tokenFile, []byte(token+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	m := startMember(t, "ui", memberOpts{extra: "api:\n  token_file: " + tokenFile + "\n  insecure: true\n", token: token})
	ctx := context.Background()
	const topic, partitions = "ui-topic", 3
	if err := m.client.CreateMirror(ctx, api.CreateMirrorRequest{Name: "ui", Properties: map[string]string{"bootstrap.servers": env.src.Bootstrap()}}); err != nil {
		t.Fatal(err)
	}
	if err := env.src.CreateTopic(ctx, topic, partitions, 1, nil); err != nil {
		t.Fatal(err)
	}
	produceTo(t, env.src, topic, partitions, 90, "ui")
	addCaughtUp(t, m, "ui", topic)
	produceSync(t, kgoClient(t, env.dst, kgo.DefaultProduceTopic(topic), kgo.RecordPartitioner(kgo.ManualPartitioner())),
		[]*kgo.Record{{Partition: 0, Value: []byte("foreign")}})
	waitState(t, m, "ui", topic, "DIVERGED")

	// A lag sample with the topic: one is taken every 15 s.
	charted := regexp.MustCompile(`<svg class="lag-chart" data-topic="ui/` + topic + `" data-points="(\d+)"`)
	url := strings.Replace(m.url, "http://", "http://admin:"+token+"@", 1) + "/ui"
	var dom string
	for deadline := time.Now().Add(45 * time.Second); ; time.Sleep(time.Second) {
		dom = chromium(t, browser, "--dump-dom", url)
		if mm := charted.FindStringSubmatch(dom); mm != nil {
			if n, _ := strconv.Atoi(mm[1]); n >= 1 {
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("no lag chart of %s on the page within 45s:\n%s", topic, dom)
		}
	}
	for p := range partitions {
		if !strings.Contains(dom, `data-partition="ui/`+topic+`/`+strconv.Itoa(p)+`"`) {
			t.Errorf("partition %d is not on the page", p)
		}
	}
	diverged := regexp.MustCompile(`(?s)<tr data-partition="ui/` + topic + `/0" data-state="DIVERGED">.*?<td class="state-DIVERGED">DIVERGED</td>.*?<td class="reason">([^<]+)</td>`)
	if mm := diverged.FindStringSubmatch(dom); mm == nil || !strings.Contains(mm[1], "destination") {
		t.Errorf("partition 0 is not shown DIVERGED with its reason:\n%s", dom)
	}
	if !strings.Contains(dom, `<tr data-member="ui">`) || !strings.Contains(dom, `<polyline class="records" points="`) {
		t.Errorf("the page lacks the member or the chart's line:\n%s", dom)
	}
	shot, err := filepath.Abs("../.cache/artifacts/ui.png")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Dir(shot), 0o755); err != nil {
		t.Fatal(err)
	}
	chromium(t, browser, "--screenshot="+shot, "--window-size=1400,1600", url)
	if fi, err := os.Stat(shot); err != nil || fi.Size() < 10_000 {
		t.Fatalf("no screenshot of the page (%v)", err)
	}
	t.Logf("screenshot of the status page: %s", shot)

	// Without the token the page is refused.
	if out := chromium(t, browser, "--dump-dom", m.url+"/ui"); strings.Contains(out, "data-partition") {
		t.Fatalf("the page showed without the token:\n%s", out)
	}
}

// chromium runs headless Chromium once with args (its own profile, no
// sandbox: the tests run as root) and returns what it printed.
func chromium(t *testing.T, browser string, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	base := []string{"--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run",
		"--user-data-dir=" + t.TempDir(), "--virtual-time-budget=5000"}
	cmd := exec.CommandContext(ctx, browser, append(base, args...)...)
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("chromium %s: %v", strings.Join(args, " "), err)
	}
	return string(out)
}
