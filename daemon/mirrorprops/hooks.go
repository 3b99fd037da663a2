package mirrorprops

import (
	"fmt"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/kmirror/kmirror/daemon/api"
	"github.com/kmirror/kmirror/raftstore"
)

// Failover hook properties (issue 22, section 5): what the raft leader
// runs once per failover of the mirror's topics.
const (
	propHookExec    = raftstore.PropFailoverHookExec
	propHookURL     = raftstore.PropFailoverHookURL
	propHookTimeout = "failover.hook.timeout.ms"
	propHookRetries = "failover.hook.retries"
)

// Failover hook defaults and bounds.
const (
	DefaultHookTimeout = 10 * time.Second
	maxHookTimeout     = 10 * time.Minute
	DefaultHookRetries = 5
	maxHookRetries     = 100
)

// hookName is what failover.hook.exec may name: a file of the members'
// hooks_dir, not a path or a command line (the API must not be a way to
// run any command on a member).
var hookName = regexp.MustCompile(`^[A-Za-z0-9_][A-Za-z0-9._-]*$`)

// Hook is a mirror's failover hook: Exec names an executable of each
// member's hooks_dir, URL is a webhook POSTed to; either or both. Timeout
// bounds one attempt of each; Retries is how many attempts follow a failed
// first one.
type Hook struct {
	Exec    string
	URL     string
	Timeout time.Duration
	Retries int
}

// parseHook reads the failover hook properties; errors say what to write.
func parseHook(props map[string]string) (Hook, error) {
	h := Hook{Exec: strings.TrimSpace(props[propHookExec]), URL: strings.TrimSpace(props[propHookURL]),
		Timeout: DefaultHookTimeout, Retries: DefaultHookRetries}
	if h.Exec != "" && (!hookName.MatchString(h.Exec) || h.Exec == "." || h.Exec == "..") {
		return Hook{}, fmt.Errorf("%w: %s=%s: give the file name of an executable in each member's hooks_dir (daemon config), "+
			"e.g. switch-dns, not a path or a command line: the leader runs it with the failover in its environment and on its standard input",
			api.ErrInvalid, propHookExec, h.Exec)
	}
	if strings.Contains(h.URL, "[hidden]") {
		return Hook{}, fmt.Errorf("%w: %s holds [hidden], as kmirror list shows it: give the URL itself, token and all, from the file you keep",
			api.ErrInvalid, propHookURL)
	}
	if h.URL != "" {
		u, err := url.Parse(h.URL)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return Hook{}, fmt.Errorf("%w: %s=%s: give an http:// or https:// URL the leader POSTs the failover to as JSON", api.ErrInvalid, propHookURL, h.URL)
		}
	}
	if v := strings.TrimSpace(props[propHookTimeout]); v != "" {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil || n < 100 || time.Duration(n)*time.Millisecond > maxHookTimeout {
			return Hook{}, fmt.Errorf("%w: %s=%s: give milliseconds from 100 to %d", api.ErrInvalid, propHookTimeout, v, maxHookTimeout.Milliseconds())
		}
		h.Timeout = time.Duration(n) * time.Millisecond
	}
	if v := strings.TrimSpace(props[propHookRetries]); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 0 || n > maxHookRetries {
			return Hook{}, fmt.Errorf("%w: %s=%s: give how many times to try again after a failed attempt, 0 to %d", api.ErrInvalid, propHookRetries, v, maxHookRetries)
		}
		h.Retries = n
	}
	if h.Exec == "" && h.URL == "" && (props[propHookTimeout] != "" || props[propHookRetries] != "") {
		return Hook{}, fmt.Errorf("%w: %s and %s set without a hook: add %s or %s", api.ErrInvalid, propHookTimeout, propHookRetries, propHookExec, propHookURL)
	}
	return h, nil
}

// RedactURL leaves a URL's password and query (where tokens go) out of
// errors, logs and kmirror list.
func RedactURL(raw string) string {
	if i := strings.IndexAny(raw, "?#"); i >= 0 {
		raw = raw[:i] + "?[hidden]"
	}
	if i, j := strings.Index(raw, "://"), strings.LastIndex(raw, "@"); i >= 0 && j > i {
		raw = raw[:i+3] + "[hidden]@" + raw[j+1:]
	}
	return raw
}
