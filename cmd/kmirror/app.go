package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"strings"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/kmirror/kmirror/daemon/api"
)

// version is set at build time: -ldflags "-X main.version=v0.1.0".
var version = "dev"

// requestTimeout bounds one admin API call.
const requestTimeout = 30 * time.Second

// Exit codes.
const (
	exitOK    = 0
	exitError = 1
	exitUsage = 2 // bad flags or arguments, or an invalid daemon config
)

// usageError is a mistake in the command line or the config file: retrying
// the same invocation cannot succeed.
type usageError struct{ err error }

func (e usageError) Error() string { return e.err.Error() }
func (e usageError) Unwrap() error { return e.err }

func usagef(format string, args ...any) error {
	return usageError{fmt.Errorf(format, args...)}
}

// run runs the CLI with args (args[0] is the program name) and returns the
// exit code. Errors are printed to stderr as one line.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	err := newApp(stdout, stderr).RunContext(ctx, args)
	if err == nil {
		return exitOK
	}
	msg := strings.ReplaceAll(strings.TrimSpace(err.Error()), "\n", "; ")
	fmt.Fprintf(stderr, "kmirror: %s\n", msg)
	var usage usageError
	var helpErr cli.ExitCoder // from `kmirror help <unknown command>`
	if errors.As(err, &usage) || errors.As(err, &helpErr) {
		return exitUsage
	}
	return exitError
}

func newApp(stdout, stderr io.Writer) *cli.App {
	app := &cli.App{
		Name:        "kmirror",
		Usage:       "mirror Kafka topics from a source cluster into a destination cluster",
		Description: "Global options go before the command: kmirror --output json list",
		HideVersion: true,
		Writer:      stdout,
		ErrWriter:   stderr,
		Flags: []cli.Flag{
			&cli.StringFlag{
				Name:    "server",
				Usage:   "`URL` of a kmirror member's HTTP API; several, separated by commas, are tried in turn",
				EnvVars: []string{"KMIRROR_SERVER"},
				Value:   "http://127.0.0.1:8080",
			},
			&cli.StringFlag{
				Name:    "token-file",
				Usage:   "`FILE` holding the API's bearer token (the members' api.token_file)",
				EnvVars: []string{"KMIRROR_TOKEN_FILE"},
			},
			&cli.StringFlag{
				Name:    "ca",
				Usage:   "`FILE` with the CA certificates (PEM) that sign the members' API certificates, for https:// servers; default: the system's CAs",
				EnvVars: []string{"KMIRROR_CA"},
			},
			&cli.StringFlag{
				Name:  "output",
				Usage: "output `FORMAT`: table or json",
				Value: "table",
			},
		},
		Before: func(c *cli.Context) error {
			if out := c.String("output"); out != "table" && out != "json" {
				return usagef("--output %q: use table or json", out)
			}
			return nil
		},
		Action: func(c *cli.Context) error {
			if c.Args().Present() {
				return usagef("unknown command %q: run 'kmirror --help' for the list", c.Args().First())
			}
			return cli.ShowAppHelp(c)
		},
		Commands: []*cli.Command{
			daemonCommand(),
			createCommand(),
			alterCommand(),
			addCommand(),
			removeCommand(),
			pauseCommand(),
			resumeCommand(),
			listCommand(),
			describeCommand(),
			verifyCommand(),
			deleteCommand(),
			membersCommand(),
			versionCommand(),
		},
		OnUsageError: onUsageError,
		// Errors come back from Run; only main exits.
		ExitErrHandler: func(*cli.Context, error) {},
	}
	for _, cmd := range app.Commands {
		cmd.OnUsageError = onUsageError
		for _, sub := range cmd.Subcommands {
			sub.OnUsageError = onUsageError
		}
	}
	return app
}

func onUsageError(c *cli.Context, err error, isSubcommand bool) error {
	if isSubcommand {
		for _, global := range []string{"server", "output"} {
			if strings.Contains(err.Error(), "flag provided but not defined: -"+global) {
				return usagef("%s: --%s is a global option: put it before the command, as in kmirror --%s ... %s", c.Command.Name, global, global, c.Command.Name)
			}
		}
		if strings.Contains(err.Error(), "for -wait-for-sync") {
			return usagef("%s: --wait-for-sync takes a duration after '=', as in --wait-for-sync=10m (run 'kmirror %s --help')",
				c.Command.Name, c.Command.Name)
		}
		return usagef("%s: %v (run 'kmirror %s --help')", c.Command.Name, err, c.Command.Name)
	}
	return usagef("%v (run 'kmirror --help')", err)
}

// checkInvocation rejects positional arguments and missing required flags;
// urfave/cli's own check would print the whole help text as well.
func checkInvocation(c *cli.Context, required ...string) error {
	name := c.Command.Name
	if c.Args().Present() {
		if name == "remove" && c.IsSet("wait-for-sync") {
			return usagef("%s: unexpected argument %q: give the timeout with '=', as in --wait-for-sync=%s", name, c.Args().First(), c.Args().First())
		}
		return usagef("%s: unexpected argument %q: values go in flags (run 'kmirror %s --help')", name, c.Args().First(), name)
	}
	var missing []string
	for _, flag := range required {
		if !c.IsSet(flag) {
			missing = append(missing, "--"+flag)
		}
	}
	if len(missing) > 0 {
		return usagef("%s: missing required flag %s (run 'kmirror %s --help')", name, strings.Join(missing, ", "), name)
	}
	return nil
}

// apiCall is the Action of a command that calls the admin API: check
// rejects a bad invocation (positional arguments, missing flags, flag
// values) before any request; then the client of --server (with
// --token-file and --ca) is built, and run makes the call and prints the
// answer as a table or JSON (--output).
func apiCall(check func(c *cli.Context) error, run func(c *cli.Context, client *api.Client) error) cli.ActionFunc {
	return func(c *cli.Context) error {
		if err := check(c); err != nil {
			return err
		}
		client, err := newClient(c)
		if err != nil {
			return err
		}
		return run(c, client)
	}
}

// required is apiCall's check of a command that takes no positional
// argument and needs the flags named.
func required(flags ...string) func(c *cli.Context) error {
	return func(c *cli.Context) error { return checkInvocation(c, flags...) }
}

// oneArgCheck is apiCall's check of a members subcommand that takes one
// positional argument (oneArg).
func oneArgCheck(name string) func(c *cli.Context) error {
	return func(c *cli.Context) error {
		_, err := oneArg(c, name)
		return err
	}
}

// newClient returns a client of the member named by --server.
func newClient(c *cli.Context) (*api.Client, error) {
	client, err := api.NewClient(c.String("server"), requestTimeout)
	if err != nil {
		return nil, usagef("--server: %v", err)
	}
	var token string
	if path := c.String("token-file"); path != "" {
		data, err := os.ReadFile(path)
		if err != nil {
			return nil, usagef("--token-file: %v", err)
		}
		token, _, _ = strings.Cut(strings.TrimSpace(string(data)), "\n")
		if token = strings.TrimSpace(token); token == "" {
			return nil, usagef("--token-file: %s is empty: it must hold the token of the members' api.token_file", path)
		}
		if host := plainRemote(c.String("server")); host != "" {
			return nil, usagef("--token-file with --server %s: the token would cross the network unencrypted to %s; "+
				"serve the API over TLS (api.tls) and use https://, or reach the member on a loopback address", c.String("server"), host)
		}
	}
	var tlsConfig *tls.Config
	if path := c.String("ca"); path != "" {
		if !strings.Contains(c.String("server"), "https://") {
			return nil, usagef("--ca is for https:// servers, and --server %s names none", c.String("server"))
		}
		data, err := os.ReadFile(path)
		if err != nil {
			return nil, usagef("--ca: %v", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(data) {
			return nil, usagef("--ca: %s holds no PEM certificate", path)
		}
		tlsConfig = &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
	}
	return client.WithAuth(tlsConfig, token), nil
}

// jsonOutput reports whether --output json was given.
func jsonOutput(c *cli.Context) bool {
	return c.String("output") == "json"
}

// plainRemote returns the first host of servers reached over http:// that
// is not a loopback address ("" if none).
func plainRemote(servers string) string {
	for _, s := range strings.Split(servers, ",") {
		u, err := url.Parse(strings.TrimSpace(s))
		if err != nil || u.Scheme != "http" {
			continue
		}
		host := u.Hostname()
		if ip := net.ParseIP(host); host == "localhost" || (ip != nil && ip.IsLoopback()) {
			continue
		}
		return host
	}
	return ""
}
