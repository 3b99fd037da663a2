package main

import (
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/kmirror/kmirror/daemon/api"
)

func membersCommand() *cli.Command {
	return &cli.Command{
		Name:  "members",
		Usage: "list the members of the kmirror group, or add, remove or drain one",
		Action: apiCall(required(), func(c *cli.Context, client *api.Client) error {
			rows, err := client.Members(c.Context)
			if err != nil {
				return err
			}
			if jsonOutput(c) {
				if rows == nil {
					rows = []api.MemberStatus{}
				}
				return writeJSON(c.App.Writer, rows)
			}
			return writeMemberTable(c.App.Writer, rows)
		}),
		Subcommands: []*cli.Command{
			{
				Name:      "add",
				Usage:     "add a member to the group (then start it with the same peers list)",
				ArgsUsage: "ID",
				Flags: []cli.Flag{
					&cli.StringFlag{Name: "raft", Usage: "`HOST:PORT` other members reach its raft transport on (required)"},
					&cli.StringFlag{Name: "http", Usage: "`HOST:PORT` of its HTTP API (required)"},
					&cli.BoolFlag{Name: "non-voter", Usage: "replicate the state and take partitions, without a vote"},
				},
				Action: apiCall(func(c *cli.Context) error {
					if _, err := oneArg(c, "ID"); err != nil {
						return err
					}
					for _, f := range []string{"raft", "http"} {
						if !c.IsSet(f) {
							return usagef("members add: missing required flag --%s (run 'kmirror members add --help')", f)
						}
					}
					return nil
				}, func(c *cli.Context, client *api.Client) error {
					id := c.Args().First() // checked by oneArg
					req := api.AddMemberRequest{ID: id, RaftAddr: c.String("raft"), HTTPAddr: c.String("http"), NonVoter: c.Bool("non-voter")}
					if err := client.AddMember(c.Context, req); err != nil {
						return err
					}
					return memberResult(c, "added", id, "added member "+id)
				}),
			},
			{
				Name:      "remove",
				Usage:     "remove a member from the group (drain it first)",
				ArgsUsage: "ID",
				Action: apiCall(oneArgCheck("ID"), func(c *cli.Context, client *api.Client) error {
					id := c.Args().First() // checked by oneArg
					if err := client.RemoveMember(c.Context, id); err != nil {
						return err
					}
					return memberResult(c, "removed", id, "removed member "+id)
				}),
			},
			{
				Name:      "drain",
				Usage:     "move every partition off a member by graceful handoff (--undo ends the drain)",
				ArgsUsage: "ID",
				Flags:     []cli.Flag{&cli.BoolFlag{Name: "undo", Usage: "let the member take partitions again"}},
				Action: apiCall(oneArgCheck("ID"), func(c *cli.Context, client *api.Client) error {
					id := c.Args().First() // checked by oneArg
					drain := !c.Bool("undo")
					if err := client.DrainMember(c.Context, id, drain); err != nil {
						return err
					}
					if drain {
						return memberResult(c, "draining", id, "draining member "+id+": its partitions move to the others (see kmirror members)")
					}
					return memberResult(c, "not draining", id, "member "+id+" takes partitions again")
				}),
			},
		},
	}
}

// oneArg returns the single positional argument of a subcommand. urfave/cli
// stops parsing flags at the first argument, so flags written after it
// (kmirror members add ID --raft ADDR) are parsed here and set on c.
func oneArg(c *cli.Context, name string) (string, error) {
	cmd := "members " + c.Command.Name
	if c.NArg() < 1 {
		return "", usagef("%s: give one %s (run 'kmirror %s --help')", cmd, name, cmd)
	}
	rest := c.Args().Tail()
	for len(rest) > 0 {
		arg := rest[0]
		if !strings.HasPrefix(arg, "-") {
			return "", usagef("%s: unexpected argument %q: give one %s (run 'kmirror %s --help')", cmd, arg, name, cmd)
		}
		flag, value, hasValue := strings.Cut(strings.TrimLeft(arg, "-"), "=")
		known, isBool := false, false
		for _, f := range c.Command.Flags {
			for _, n := range f.Names() {
				if n == flag {
					known = true
					_, isBool = f.(*cli.BoolFlag)
				}
			}
		}
		if !known {
			return "", usagef("%s: unknown flag %s (run 'kmirror %s --help')", cmd, arg, cmd)
		}
		rest = rest[1:]
		switch {
		case hasValue:
		case isBool:
			value = "true"
		case len(rest) == 0:
			return "", usagef("%s: flag %s needs a value (run 'kmirror %s --help')", cmd, arg, cmd)
		default:
			value, rest = rest[0], rest[1:]
		}
		if err := c.Set(flag, value); err != nil {
			return "", usagef("%s: %s: %v", cmd, arg, err)
		}
	}
	return c.Args().First(), nil
}

func memberResult(c *cli.Context, result, id, line string) error {
	if jsonOutput(c) {
		return writeJSON(c.App.Writer, struct {
			Result string `json:"result"`
			Member string `json:"member"`
		}{result, id})
	}
	_, err := fmt.Fprintln(c.App.Writer, line)
	return err
}

// writeMemberTable prints the rows of `kmirror members`.
func writeMemberTable(w io.Writer, members []api.MemberStatus) error {
	rows := [][]string{{"ID", "RAFT-ADDRESS", "HTTP-ADDRESS", "ROLE", "PARTITIONS", "LAST-CONTACT", "LEASE-GRANTED", "LEASE-TTL", "STATE"}}
	for _, m := range members {
		contact, granted, ttl := "-", "-", "-"
		if m.Role != "leader" && m.LastContactMs >= 0 {
			contact = (time.Duration(m.LastContactMs) * time.Millisecond).Round(100*time.Millisecond).String() + " ago"
		}
		if m.Role != "leader" && m.LeaseGrantedMs >= 0 {
			granted = (time.Duration(m.LeaseGrantedMs) * time.Millisecond).Round(100*time.Millisecond).String() + " ago"
		}
		if m.LeaseTTLMs > 0 {
			ttl = (time.Duration(m.LeaseTTLMs) * time.Millisecond).String()
		}
		rows = append(rows, []string{m.ID, m.RaftAddr, m.HTTPAddr, m.Role, strconv.Itoa(m.Partitions), contact, granted, ttl, m.State})
	}
	if err := writeTable(w, rows); err != nil {
		return err
	}
	// Why raft cannot reach a member, under the table: these are long.
	for _, m := range members {
		if m.Error != "" {
			if _, err := fmt.Fprintf(w, "%s: %s\n", m.ID, m.Error); err != nil {
				return err
			}
		}
	}
	return nil
}
