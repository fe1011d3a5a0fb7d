package main

import (
	"fmt"
	"io"
	"os/exec"
	"slices"
	"strings"
	"text/tabwriter"
	"time"
	"unicode/utf8"

	"github.com/leapflow/leapflow/global/redistest"
	"github.com/leapflow/leapflow/internal/trace"
)

// table writes a header and rows as aligned text, or as a Markdown table.
func table(w io.Writer, md bool, header []string, rows [][]string) {
	if md {
		// The first column (names) aligns left, the others right.
		cell := strings.NewReplacer("|", `\|`).Replace
		line := func(cells []string) {
			esc := make([]string, len(cells))
			for i, c := range cells {
				esc[i] = cell(c)
			}
			fmt.Fprintf(w, "| %s |\n", strings.Join(esc, " | "))
		}
		line(header)
		fmt.Fprintf(w, "|---|%s\n", strings.Repeat("---:|", len(header)-1))
		for _, r := range rows {
			line(r)
		}
		return
	}
	// Every cell ends in a tab, so that each is a column of its own (the
	// last one too); numbers align right, the first column (names) left.
	first := utf8.RuneCountInString(header[0])
	for _, r := range rows {
		if len(r) > 0 {
			first = max(first, utf8.RuneCountInString(r[0]))
		}
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	for _, r := range append([][]string{header}, rows...) {
		cells := slices.Clone(r)
		if len(cells) > 0 {
			cells[0] += strings.Repeat(" ", first-utf8.RuneCountInString(cells[0]))
		}
		fmt.Fprintf(tw, "%s\t\n", strings.Join(cells, "\t"))
	}
	tw.Flush()
}

func loadRows(rows []loadRow, withOracle bool) [][]string {
	var out [][]string
	for _, x := range rows {
		r := []string{x.pattern, fmt.Sprint(x.threshold), fmt.Sprint(x.instances), fmt.Sprint(x.sent), fmt.Sprint(x.admitted)}
		if withOracle {
			r = append(r, fmt.Sprint(x.oracle), fmt.Sprintf("%.3f", trace.Ratio(x.admitted, x.oracle)))
		} else {
			r = append(r, fmt.Sprintf("%.1f%%", 100*trace.Ratio(x.admitted, x.sent)))
		}
		r = append(r, fmt.Sprint(x.fullest), fmt.Sprintf("%.4f", trace.Ratio(x.calls, x.admitted)), fmt.Sprint(x.fallbacks))
		out = append(out, r)
	}
	return out
}

func ms(d time.Duration) string { return fmt.Sprintf("%.2f", float64(d)/float64(time.Millisecond)) }

// globalLoadTables writes the global layer's load figures.
func globalLoadTables(w io.Writer, md bool, l globalLoad) {
	head := func(title, text string) {
		if md {
			fmt.Fprintf(w, "\n### %s\n\n%s\n\n", title, text)
		} else {
			fmt.Fprintf(w, "\n%s\n", title)
		}
	}
	if len(l.partial) > 0 {
		head("Below the limit", "Evenly spaced requests at a share of the threshold (T/s) on instances sharing one global rule "+
			"with default options: the share admitted, the fullest server window, and Redis round trips per admission.")
		table(w, md, []string{"arrivals", "T", "instances", "sent", "admitted", "share", "fullest window", "calls/admitted", "fallbacks"}, loadRows(l.partial, false))
	}
	if len(l.oracle) > 0 {
		head("Random arrivals against the oracle", "Traces at 1.5 T/s (Poisson; bursty: bursts of 5x that; one hot: 90% on one instance) "+
			"replayed in real time. The oracle is the server's bucketed window run in one place, with every request in view, on the "+
			"same sending times: *ratio* is admitted over what it admits.")
		table(w, md, []string{"arrivals", "T", "instances", "sent", "admitted", "oracle", "ratio", "fullest window", "calls/admitted", "fallbacks"}, loadRows(l.oracle, true))
	}
	if len(l.latency) > 0 {
		head("Entry latency with Redis far away", "Poisson arrivals at 500/s on 4 instances, T = 1000/s, default options, "+
			"through a proxy that delays every byte by half the round trip each way (ms).")
		var rows [][]string
		for _, x := range l.latency {
			rows = append(rows, []string{x.rtt.String(), fmt.Sprint(x.sent), fmt.Sprint(x.admitted), ms(x.p50), ms(x.p99), ms(x.p999), ms(x.max),
				fmt.Sprint(x.late), fmt.Sprint(x.fallbacks)})
		}
		table(w, md, []string{"round trip", "sent", "admitted", "p50", "p99", "p99.9", "max", "late", "fallbacks"}, rows)
	}
	if len(l.busy) > 0 {
		head("Saturated CPU, healthy Redis", "Goroutines spin on one global rule of 1000/s with FallbackOpen: a fallback would admit "+
			"without limit. *late*: requests refused because no answer came within Options.Timeout.")
		var rows [][]string
		for _, x := range l.busy {
			rows = append(rows, []string{fmt.Sprint(x.goroutines), fmt.Sprintf("%.1f", x.seconds), fmt.Sprint(x.admitted), fmt.Sprint(x.fullest),
				fmt.Sprint(x.fallbacks), fmt.Sprint(x.late)})
		}
		table(w, md, []string{"goroutines", "seconds", "admitted", "fullest window", "fallbacks", "late"}, rows)
	}
}

// globalLoadSection is the named section of the global layer under load,
// on a redis-server it starts itself.
func globalLoadSection(cfg config, w io.Writer) error {
	if _, err := exec.LookPath("redis-server"); err != nil {
		return fmt.Errorf("bench: global-load needs redis-server (make test installs it from Debian's packages)")
	}
	srv, err := redistest.Launch()
	if err != nil {
		return err
	}
	defer srv.Stop()
	globalLoadTables(w, false, loadSection(srv, cfg, func(string) {}))
	return nil
}
