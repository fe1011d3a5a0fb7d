// Command leapflow checks and formats leapflow rule files, and serves
// rate limits to gateways.
//
//	leapflow check rules.yaml [more.yaml | rules.d ...]   # validate; print each file's rules in normal form
//	leapflow fmt rules.yaml [rules.d ...]                 # print the normal form; -w rewrites the files
//	leapflow serve -config ratelimit.d [-redis host:6379] # Envoy's RLS v3 (see package rls and serve -h)
//
// The normal form keeps the file's comments, each beside the rule or key
// it was written beside (see rulefile.FormatFile). fmt -w writes only what
// reads back to the same rules with every comment, through a temporary
// file and a rename; it does not rewrite a .json file (the normal form is
// YAML).
//
// A directory stands for its .yaml, .yml and .json files: check merges
// them, fmt formats each (printing each one's name first when there are
// several). A bad file is reported as file:line:column with the rule and
// key, and the command exits 1; a usage error exits 2.
//
// The command is a module of its own (github.com/leapflow/leapflow/cmd/leapflow),
// so that the gRPC and Envoy types serve needs stay out of flow's users'
// builds; from a clone, `go install .` in this directory.
package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/leapflow/leapflow/flow"
	"github.com/leapflow/leapflow/rulefile"
)

func main() { os.Exit(run(os.Args[1:], os.Stdout, os.Stderr)) }

const usage = `usage:
  leapflow check FILE|DIR...    validate rule files and print them in normal form
  leapflow fmt [-w] FILE|DIR... print rule files in normal form, comments kept (-w: rewrite them)
  leapflow serve [flags]        serve Envoy's rate limit protocol (serve -h: its flags)
`

// run is the command; it returns the exit status.
func run(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return 2
	}
	switch args[0] {
	case "check":
		return check(args[1:], stdout, stderr)
	case "fmt":
		return format(args[1:], stdout, stderr)
	case "serve":
		return serveCmd(args[1:], stderr)
	case "help", "-h", "--help":
		fmt.Fprint(stdout, usage)
		return 0
	}
	fmt.Fprintf(stderr, "leapflow: unknown command %q\n%s", args[0], usage)
	return 2
}

// read reads a file or a directory's files.
func read(path string) ([]flow.Rule, error) {
	if st, err := os.Stat(path); err == nil && st.IsDir() {
		return rulefile.ReadDir(path)
	}
	return rulefile.ReadFile(path)
}

func check(paths []string, stdout, stderr io.Writer) int {
	if len(paths) == 1 && (paths[0] == "-h" || paths[0] == "--help") {
		fmt.Fprint(stdout, usage)
		return 0
	}
	if len(paths) == 0 {
		fmt.Fprint(stderr, usage)
		return 2
	}
	status := 0
	for _, p := range paths {
		rules, err := read(p)
		if err != nil {
			fmt.Fprintln(stderr, err)
			status = 1
			continue
		}
		out, err := rulefile.Format(rules)
		if err != nil {
			fmt.Fprintln(stderr, err)
			status = 1
			continue
		}
		fmt.Fprintf(stdout, "# %s: %d rules, valid\n%s", p, len(rules), out)
	}
	return status
}

func format(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("fmt", flag.ContinueOnError)
	fs.SetOutput(stderr)
	write := fs.Bool("w", false, "rewrite the files in normal form")
	if err := fs.Parse(args); err != nil || fs.NArg() == 0 {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		if err == nil {
			fmt.Fprint(stderr, usage)
		}
		return 2
	}
	status := 0
	var files []string
	for _, p := range fs.Args() {
		if st, err := os.Stat(p); err == nil && st.IsDir() {
			paths, err := rulefile.Files(p)
			if err != nil {
				fmt.Fprintln(stderr, err)
				status = 1
			}
			files = append(files, paths...)
			continue
		}
		files = append(files, p)
	}
	for _, p := range files {
		out, err := rulefile.FormatFile(p)
		switch {
		case err != nil:
		case *write && strings.EqualFold(filepath.Ext(p), ".json"):
			// Another reader of the file may want JSON.
			err = fmt.Errorf("%s: not rewritten: the normal form is YAML (print it without -w, into a .yaml file)", p)
		case *write:
			err = replace(p, out)
		case len(files) > 1:
			_, err = fmt.Fprintf(stdout, "# %s\n%s", p, out)
		default:
			_, err = stdout.Write(out)
		}
		if err != nil {
			fmt.Fprintln(stderr, err)
			status = 1
		}
	}
	return status
}

// replace writes data over path through a temporary file in its directory
// and a rename, so the file is never left half written; its mode is kept.
func replace(path string, data []byte) error {
	mode := os.FileMode(0o644)
	if st, err := os.Stat(path); err == nil {
		mode = st.Mode().Perm()
	}
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name()) // after the rename, nothing to remove
	if _, err := tmp.Write(data); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Chmod(mode); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), path)
}
