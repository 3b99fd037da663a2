package main

import (
	"fmt"
	"io"
	"strconv"

	"github.com/urfave/cli/v2"

	"github.com/kmirror/kmirror/daemon/api"
)

// errMismatch makes kmirror verify exit 1 after its report when a
// partition differs (or could not be compared).
var errMismatch = fmt.Errorf("the destination differs from the source, or a partition could not be compared: see the report above")

func verifyCommand() *cli.Command {
	return &cli.Command{
		Name: "verify",
		Usage: "compare a topic's destination with its source record by record over what has been mirrored (exit 0: equal; " +
			"1: a mismatch or a partition not compared)",
		Flags: []cli.Flag{
			mirrorFlag("`NAME` of the mirror (required)"),
			&cli.StringFlag{Name: "topic", Usage: "`TOPIC` to verify (required)"},
			&cli.BoolFlag{Name: "full", Usage: "compare every mirrored record (default: sampled offsets, the first and last among them)"},
			&cli.IntFlag{Name: "samples", Usage: "`N` offsets per partition in sampled mode", Value: api.DefaultVerifySamples},
		},
		Action: apiCall(required("mirror", "topic"), func(c *cli.Context, client *api.Client) error {
			if c.IsSet("samples") && c.Bool("full") {
				return usagef("verify: --samples is for sampled mode; leave it out with --full")
			}
			if c.Int("samples") <= 0 {
				return usagef("verify: --samples %d: give a positive number", c.Int("samples"))
			}
			rows, err := client.Verify(c.Context, api.VerifyRequest{Mirror: c.String("mirror"), Topic: c.String("topic"),
				Full: c.Bool("full"), Samples: c.Int("samples")})
			if err != nil {
				return err
			}
			if jsonOutput(c) {
				err = writeJSON(c.App.Writer, rows)
			} else {
				err = writeVerifyTable(c.App.Writer, rows)
			}
			if err != nil {
				return err
			}
			for _, r := range rows {
				if r.Mismatch != "" || r.Skipped != "" {
					return errMismatch
				}
			}
			return nil
		}),
	}
}

// writeVerifyTable prints kmirror verify's report, a row per partition.
func writeVerifyTable(w io.Writer, rows []api.VerifyPartition) error {
	table := [][]string{{"PARTITION", "SOURCE-OFFSETS", "COMPARED", "RESULT"}}
	for _, r := range rows {
		span := "-"
		if r.From >= 0 && r.To >= 0 {
			span = fmt.Sprintf("%d..%d", r.From, r.To-1)
			if r.From >= r.To {
				span = "none mirrored"
			}
		}
		result := "equal"
		switch {
		case r.From >= 0 && r.From >= r.To && r.Mismatch == "" && r.Skipped == "":
			result = "nothing to compare: no mirrored record the source still holds"
		case r.Mismatch != "":
			result = "MISMATCH: " + r.Mismatch
		case r.Skipped != "":
			result = "not compared: " + r.Skipped
		}
		table = append(table, []string{strconv.Itoa(int(r.Partition)), span, strconv.FormatInt(r.Compared, 10), result})
	}
	return writeTable(w, table)
}
