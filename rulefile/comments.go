package rulefile

import (
	"sort"
	"strings"

	"github.com/goccy/go-yaml/lexer"
	"github.com/goccy/go-yaml/token"
)

// fileComments are a rule file's comments, each placed by what it stands
// beside, so that the normal form keeps them:
//   - a comment line goes with what follows it: the file's head (before
//     the rules), a rule, or a key of a rule;
//   - a comment at the end of a key's line stays at the end of that key's
//     line;
//   - comments after the last rule stay at the end of the file.
//
// A comment inside a keys list moves above the list, and the comments of
// a key the normal form leaves out (a default) move above its rule. None
// is lost: formatData checks that its output holds every one.
type fileComments struct {
	head, tail []string
	rules      []*ruleComments
}

// ruleComments are the comments of one rule.
type ruleComments struct {
	head  []string            // the lines before the rule
	heads map[string][]string // the lines before a key
	line  map[string]string   // the comment ending a key's line
}

// collectComments places the comments of data (as the decoder read it:
// no byte-order mark) against its raw rules.
func collectComments(data []byte, raw []rawRule) *fileComments {
	toks := lexer.Tokenize(string(data))
	c := &fileComments{rules: make([]*ruleComments, len(raw))}
	for i := range c.rules {
		c.rules[i] = &ruleComments{heads: map[string][]string{}, line: map[string]string{}}
	}
	// The lines that hold something other than comments, in order.
	var lines []int
	for _, t := range toks {
		if t.Type != token.CommentType && (len(lines) == 0 || lines[len(lines)-1] != t.Position.Line) {
			lines = append(lines, t.Position.Line)
		}
	}
	// owner is the rule and key a line belongs to: the rule whose item
	// starts at or before it, and that rule's last key at or before it
	// ("" for the rule's own line when its first key is on a later one).
	owner := func(line int) (int, string) {
		j := sort.Search(len(raw), func(i int) bool { return raw[i].start > line }) - 1
		if j < 0 {
			return -1, ""
		}
		key, at, col := "", 0, 0
		for k, l := range raw[j].lines {
			if c := raw[j].cols[k]; l <= line && (l > at || l == at && c > col) {
				key, at, col = k, l, c
			}
		}
		return j, key
	}
	last := 0 // the line of the head's last comment
	for _, t := range toks {
		if t.Type != token.CommentType {
			continue
		}
		text := "#" + strings.TrimRight(t.Value, " \t\r")
		l := t.Position.Line
		i := sort.SearchInts(lines, l)
		alone := i == len(lines) || lines[i] != l
		if !alone { // a comment ending a line of the file
			j, key := owner(l)
			switch {
			case j < 0:
				c.head = append(c.head, text)
				continue
			case key != "" && raw[j].lines[key] == l && c.rules[j].line[key] == "":
				c.rules[j].line[key] = text
				continue
			}
			// A line without a key (closing brackets, the end of a
			// string over several lines, a rule's "-"): the comment goes
			// with what follows, as a comment line would.
			i++
		}
		if i == len(lines) { // after everything
			c.tail = append(c.tail, text)
			continue
		}
		next := lines[i]
		j, key := owner(next)
		switch {
		case j < 0:
			if len(c.head) > 0 && l > last+1 { // a blank line between the head's comments
				c.head = append(c.head, "")
			}
			last = l
			c.head = append(c.head, text)
		case next == raw[j].start:
			c.rules[j].head = append(c.rules[j].head, text)
		default:
			c.rules[j].heads[key] = append(c.rules[j].heads[key], text)
		}
	}
	return c
}

func (c *fileComments) headLines() []string {
	if c == nil {
		return nil
	}
	return c.head
}

func (c *fileComments) tailLines() []string {
	if c == nil {
		return nil
	}
	return c.tail
}

// of is rule i's comments (nil without comments).
func (c *fileComments) of(i int) *ruleComments {
	if c == nil || i >= len(c.rules) {
		return nil
	}
	return c.rules[i]
}

// writeLines writes comment lines at an indent ("" for a blank line).
func writeLines(b *strings.Builder, lines []string, indent string) {
	for _, l := range lines {
		if l == "" {
			b.WriteString("\n")
			continue
		}
		b.WriteString(indent + l + "\n")
	}
}

// writeHead writes the lines before a rule: its own, its first key's, and
// those of keys the normal form leaves out (in the file's order of keys).
func (r *ruleComments) writeHead(b *strings.Builder, first string, written map[string]bool) {
	if r == nil {
		return
	}
	writeLines(b, r.head, "  ")
	writeLines(b, r.heads[""], "  ")
	writeLines(b, r.heads[first], "  ")
	for _, k := range ruleKeys {
		if written[k] {
			continue
		}
		writeLines(b, r.heads[k], "  ")
		if l := r.line[k]; l != "" {
			writeLines(b, []string{l}, "  ")
		}
	}
}

func (r *ruleComments) fieldHead(key string) []string {
	if r == nil {
		return nil
	}
	return r.heads[key]
}

func (r *ruleComments) fieldLine(key string) string {
	if r == nil {
		return ""
	}
	return r.line[key]
}

// commentTexts are the comments of data, sorted.
func commentTexts(data []byte) []string {
	var out []string
	for _, t := range lexer.Tokenize(string(data)) {
		if t.Type == token.CommentType {
			out = append(out, strings.TrimRight(t.Value, " \t\r"))
		}
	}
	sort.Strings(out)
	return out
}
