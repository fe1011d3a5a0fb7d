package main

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"log"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/leapflow/leapflow/flow"
)

// Example is main, statement for statement (TestReadmeShowsThisProgram
// checks it), so that the README's program runs as printed.
func Example() {
	eng, err := flow.New()
	if err != nil {
		log.Fatal(err)
	}
	// 2 requests a second on "hello". A bad rule is an error naming the
	// field and value, and changes nothing.
	if err := eng.LoadRules([]flow.Rule{{Resource: "hello", Threshold: 2}}); err != nil {
		log.Fatal(err)
	}
	for i := 1; i <= 3; i++ {
		en, err := eng.Entry("hello")
		if err != nil { // errors.Is(err, flow.ErrBlocked); en.Refusal().RetryAfter says when to retry
			fmt.Printf("request %d: %v\n", i, err)
			continue
		}
		fmt.Printf("request %d: admitted\n", i)
		en.Exit(nil) // Exit(err) counts an exception; every admitted Entry exits once
	}

	// Output:
	// request 1: admitted
	// request 2: admitted
	// request 3: flow: "hello" blocked by rule "hello" (QPS 2, Reject, flow)
}

// The README's hello world is this program, byte for byte, and Example
// (whose output go test checks) is its main, statement for statement.
func TestReadmeShowsThisProgram(t *testing.T) {
	prog, err := os.ReadFile("main.go")
	require.NoError(t, err)
	readme, err := os.ReadFile("../../README.md")
	require.NoError(t, err)
	assert.Contains(t, string(readme), "```go\n"+string(prog)+"```\n", "the README's hello world is examples/hello/main.go")

	assert.Equal(t, body(t, "main.go", "main"), body(t, "main_test.go", "Example"))
}

// body is the source of a function's body, without its Output comment.
func body(t *testing.T, file, fn string) string {
	t.Helper()
	src, err := os.ReadFile(file)
	require.NoError(t, err)
	f, err := parser.ParseFile(token.NewFileSet(), file, src, 0)
	require.NoError(t, err)
	for _, d := range f.Decls {
		if fd, ok := d.(*ast.FuncDecl); ok && fd.Name.Name == fn {
			b := string(src[fd.Body.Lbrace : fd.Body.Rbrace-1])
			if i := strings.Index(b, "\n\t// Output:"); i >= 0 {
				b = b[:i]
			}
			return strings.TrimSpace(b)
		}
	}
	t.Fatalf("%s: no func %s", file, fn)
	return ""
}

// Every example program can be copied out of this repository: none
// imports an internal package (their tests may).
func TestExamplesImportNothingInternal(t *testing.T) {
	files, err := filepath.Glob("../*/*.go")
	require.NoError(t, err)
	require.NotEmpty(t, files)
	for _, file := range files {
		if strings.HasSuffix(file, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(token.NewFileSet(), file, nil, parser.ImportsOnly)
		require.NoError(t, err)
		for _, im := range f.Imports {
			assert.NotContains(t, im.Path.Value, "/internal", "%s imports %s", file, im.Path.Value)
		}
	}
}

// The README's first screen, before its install steps, states what a rule
// promises exactly (a plain window's bound over a continuous span, and how
// to hold every span), sets leapflow beside the three peers a user would
// weigh, and says the test command installs with sudo before giving it.
func TestReadmeFirstScreen(t *testing.T) {
	readme, err := os.ReadFile("../../README.md")
	require.NoError(t, err)
	first, _, ok := strings.Cut(string(readme), "## Install")
	require.True(t, ok)
	for _, want := range []string{"up to 2T", "`SpanExact: true`", "| x/time/rate |", "go.uber.org/ratelimit", "sentinel-golang", "measured elsewhere", "package main"} {
		assert.Contains(t, first, want)
	}
	sudo := strings.Index(string(readme), "through `sudo`")
	cmd := strings.Index(string(readme), "make test        #")
	assert.True(t, sudo > 0 && cmd > sudo, "the sudo note comes before the test command")
}
