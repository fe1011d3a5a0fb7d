package rls

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/goccy/go-yaml"
	"github.com/goccy/go-yaml/lexer"
	"github.com/goccy/go-yaml/token"
)

// The bounds on a configuration, read from files: each is far above what a
// gateway's limits need and keeps a bad or hostile file from taking the
// server's memory.
const (
	// MaxConfigSize is the largest configuration file read, in bytes.
	MaxConfigSize = 4 << 20
	// MaxDescriptors is the most descriptors (tree nodes) of all domains.
	MaxDescriptors = 100_000
	// MaxLimits is the most rate limits of all domains: each is a
	// resource, and an engine holds 10,000 (flow.WithMaxResources).
	MaxLimits = 10_000
	// MaxDepth is the deepest a descriptor tree nests (and so the most
	// entries a request descriptor that matches a limit has).
	MaxDepth = 16
)

// Unit is a rate limit's unit, as envoyproxy/ratelimit's configuration
// names it.
type Unit int

// The units a limit may be written in.
const (
	Second Unit = iota + 1
	Minute
	Hour
	Day
)

var unitNames = map[string]Unit{"second": Second, "minute": Minute, "hour": Hour, "day": Day}

// Duration is the unit's length.
func (u Unit) Duration() time.Duration {
	switch u {
	case Second:
		return time.Second
	case Minute:
		return time.Minute
	case Hour:
		return time.Hour
	case Day:
		return 24 * time.Hour
	}
	return 0
}

// String is the unit's name in the configuration.
func (u Unit) String() string {
	for n, v := range unitNames {
		if v == u {
			return n
		}
	}
	return fmt.Sprintf("Unit(%d)", int(u))
}

// fileConfig is one file of envoyproxy/ratelimit's configuration: a domain
// and its descriptor tree.
type fileConfig struct {
	Domain      string           `yaml:"domain"`
	Descriptors []fileDescriptor `yaml:"descriptors"`
}

type fileDescriptor struct {
	Key            string           `yaml:"key"`
	Value          *string          `yaml:"value"`
	RateLimit      *fileRateLimit   `yaml:"rate_limit"`
	ShadowMode     bool             `yaml:"shadow_mode"`
	DetailedMetric bool             `yaml:"detailed_metric"` // accepted; every limit has its own metrics here
	ValueToMetric  bool             `yaml:"value_to_metric"` // accepted, as detailed_metric
	Descriptors    []fileDescriptor `yaml:"descriptors"`
}

type fileRateLimit struct {
	Name            string   `yaml:"name"`
	Unit            string   `yaml:"unit"`
	RequestsPerUnit *int64   `yaml:"requests_per_unit"`
	Unlimited       bool     `yaml:"unlimited"`
	Replaces        []string `yaml:"replaces"`
}

// Config is a set of domains, each a descriptor tree, as
// envoyproxy/ratelimit's configuration files write them; LoadConfig reads
// them and Server.Load puts them in force.
type Config struct {
	domains map[string]*node
	limits  []*node // every node with a limit, in file order
}

// node is a descriptor in a domain's tree: the entry key and, unless it
// is a wildcard (one limit per distinct value), its value.
type node struct {
	key, value string
	wildcard   bool
	// path names the node in errors and is its resource's name (see
	// resourceName).
	path      string
	limit     *Limit
	unlimited bool
	shadow    bool
	// children by entry key: the exact values first, then the key's
	// wildcard.
	exact map[string]map[string]*node
	any   map[string]*node
	// perKey: a wildcard on the way to this node (its limit is per value).
	perKey bool
}

// Limit is a descriptor's rate limit.
type Limit struct {
	Name            string
	Unit            Unit
	RequestsPerUnit int64
}

// ConfigError is a configuration that cannot be used: the file, the
// descriptor (as a path of key=value entries) and why.
type ConfigError struct {
	File, Descriptor, Msg string
}

func (e *ConfigError) Error() string {
	s := "rls: "
	if e.File != "" {
		s += e.File + ": "
	}
	if e.Descriptor != "" {
		s += e.Descriptor + ": "
	}
	return s + e.Msg
}

// LoadConfig reads envoyproxy/ratelimit configuration files: path is a
// file or a directory, whose .yaml and .yml files are read (in name
// order), one domain each. Every file is read through MaxConfigSize, and
// anchors and aliases are refused (a file of aliases can expand past any
// size bound).
func LoadConfig(path string) (*Config, error) {
	st, err := os.Stat(path)
	if err != nil {
		return nil, err
	}
	files := []string{path}
	if st.IsDir() {
		entries, err := os.ReadDir(path)
		if err != nil {
			return nil, err
		}
		files = files[:0]
		for _, e := range entries {
			if ext := filepath.Ext(e.Name()); !e.IsDir() && (ext == ".yaml" || ext == ".yml") && !strings.HasPrefix(e.Name(), ".") {
				files = append(files, filepath.Join(path, e.Name()))
			}
		}
		sort.Strings(files)
	}
	datas := make(map[string][]byte, len(files))
	for _, f := range files {
		data, err := readLimited(f)
		if err != nil {
			return nil, err
		}
		datas[f] = data
	}
	return ParseConfig(files, datas)
}

// readLimited reads a regular file of at most MaxConfigSize bytes.
func readLimited(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if !st.Mode().IsRegular() {
		return nil, &ConfigError{File: path, Msg: "not a regular file"}
	}
	data, err := io.ReadAll(io.LimitReader(f, MaxConfigSize+1))
	if err != nil {
		return nil, err
	}
	if len(data) > MaxConfigSize {
		return nil, &ConfigError{File: path, Msg: fmt.Sprintf("larger than %d bytes", MaxConfigSize)}
	}
	return data, nil
}

// ParseConfig parses configuration files already read: names in order,
// datas by name.
func ParseConfig(names []string, datas map[string][]byte) (*Config, error) {
	c := &Config{domains: map[string]*node{}}
	count := 0
	for _, name := range names {
		data := datas[name]
		if len(data) > MaxConfigSize {
			return nil, &ConfigError{File: name, Msg: fmt.Sprintf("larger than %d bytes", MaxConfigSize)}
		}
		// Before the parser: its cost grows with the square of a file's
		// flow nesting ([[[...), which a small file can make deep.
		flow := 0
		for _, tk := range lexer.Tokenize(string(data)) {
			switch tk.Type {
			case token.AnchorType, token.AliasType:
				return nil, &ConfigError{File: name, Msg: fmt.Sprintf("line %d: YAML anchors and aliases are not accepted", tk.Position.Line)}
			case token.SequenceStartType, token.MappingStartType:
				if flow++; flow > maxFlowDepth {
					return nil, &ConfigError{File: name, Msg: fmt.Sprintf("line %d: nested deeper than %d", tk.Position.Line, maxFlowDepth)}
				}
			case token.SequenceEndType, token.MappingEndType:
				flow--
			}
		}
		var fc fileConfig
		if err := yaml.UnmarshalWithOptions(data, &fc, yaml.DisallowUnknownField()); err != nil {
			return nil, &ConfigError{File: name, Msg: yaml.FormatError(err, false, false)}
		}
		if fc.Domain == "" {
			return nil, &ConfigError{File: name, Msg: "domain: must not be empty"}
		}
		if len(fc.Domain) > maxEntryLen {
			return nil, &ConfigError{File: name, Msg: fmt.Sprintf("domain: longer than %d bytes", maxEntryLen)}
		}
		if _, dup := c.domains[fc.Domain]; dup {
			return nil, &ConfigError{File: name, Msg: fmt.Sprintf("domain %q: configured in two files", fc.Domain)}
		}
		root := &node{path: fc.Domain}
		if err := c.add(root, fc.Descriptors, 1, false, name, &count); err != nil {
			return nil, err
		}
		c.domains[fc.Domain] = root
	}
	return c, nil
}

// maxEntryLen bounds a domain, key or value, in the configuration and in
// requests.
const maxEntryLen = 256

// maxFlowDepth bounds the nesting of flow collections ([...], {...}): a
// descriptor tree of MaxDepth written in flow style, and some.
const maxFlowDepth = 4*MaxDepth + 8

func (c *Config) add(parent *node, ds []fileDescriptor, depth int, perKey bool, file string, count *int) error {
	for i := range ds {
		d := &ds[i]
		where := fmt.Sprintf("%s descriptors[%d]", parent.path, i)
		fail := func(format string, args ...any) error {
			return &ConfigError{File: file, Descriptor: where, Msg: fmt.Sprintf(format, args...)}
		}
		if *count++; *count > MaxDescriptors {
			return fail("more than %d descriptors", MaxDescriptors)
		}
		if depth > MaxDepth {
			return fail("nested deeper than %d", MaxDepth)
		}
		switch {
		case d.Key == "":
			return fail("key: must not be empty")
		case len(d.Key) > maxEntryLen:
			return fail("key: longer than %d bytes", maxEntryLen)
		case d.Value != nil && len(*d.Value) > maxEntryLen:
			return fail("value: longer than %d bytes", maxEntryLen)
		case d.Value != nil && strings.HasSuffix(*d.Value, "*"):
			return fail("value %q: prefix wildcards are not supported (leave value out for a limit per distinct value)", *d.Value)
		}
		if d.Value != nil && *d.Value == "" {
			d.Value = nil // as envoyproxy/ratelimit reads it: a limit per distinct value
		}
		n := &node{key: d.Key, wildcard: d.Value == nil, shadow: d.ShadowMode, perKey: perKey || d.Value == nil}
		if d.Value != nil {
			n.value = *d.Value
			n.path = parent.path + "/" + escape(d.Key) + "=" + escape(n.value)
			where = parent.path + "/" + d.Key + "=" + n.value
		} else {
			n.path = parent.path + "/" + escape(d.Key)
			where = parent.path + "/" + d.Key
		}
		if n.wildcard {
			if parent.any == nil {
				parent.any = map[string]*node{}
			}
			if parent.any[d.Key] != nil {
				return fail("key %q without a value is configured twice", d.Key)
			}
			parent.any[d.Key] = n
		} else {
			if parent.exact == nil {
				parent.exact = map[string]map[string]*node{}
			}
			vals := parent.exact[d.Key]
			if vals == nil {
				vals = map[string]*node{}
				parent.exact[d.Key] = vals
			}
			if vals[n.value] != nil {
				return fail("key %q value %q is configured twice", d.Key, n.value)
			}
			vals[n.value] = n
		}
		if rl := d.RateLimit; rl != nil {
			if len(rl.Replaces) > 0 {
				return fail("rate_limit.replaces: not supported (every matching limit applies)")
			}
			switch {
			case rl.Unlimited:
				if rl.RequestsPerUnit != nil || rl.Unit != "" {
					return fail("rate_limit: unlimited takes no unit or requests_per_unit")
				}
				n.unlimited = true
			default:
				u, ok := unitNames[strings.ToLower(rl.Unit)]
				if !ok {
					return fail("rate_limit.unit %q: must be second, minute, hour or day", rl.Unit)
				}
				if rl.RequestsPerUnit == nil {
					return fail("rate_limit.requests_per_unit: required")
				}
				if rpu := *rl.RequestsPerUnit; rpu < 0 || rpu > maxRequestsPerUnit {
					return fail("rate_limit.requests_per_unit %d: must be in [0, %d]", rpu, int64(maxRequestsPerUnit))
				}
				if len(c.limits) == MaxLimits {
					return fail("more than %d limits (the resources an engine holds)", MaxLimits)
				}
				n.limit = &Limit{Name: rl.Name, Unit: u, RequestsPerUnit: *rl.RequestsPerUnit}
				c.limits = append(c.limits, n)
			}
		}
		if err := c.add(n, d.Descriptors, depth+1, n.perKey, file, count); err != nil {
			return err
		}
	}
	return nil
}

// maxRequestsPerUnit is the largest requests_per_unit: the proto's uint32.
const maxRequestsPerUnit = 1<<32 - 1

// escape writes s so that a path of entries reads back one way: '/', '='
// and '\' are escaped with '\'.
func escape(s string) string {
	if !strings.ContainsAny(s, `/=\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if c := s[i]; c == '/' || c == '=' || c == '\\' {
			b.WriteByte('\\')
		}
		b.WriteByte(s[i])
	}
	return b.String()
}
