package flow

// A rule kind is everything the engine does with one kind of rule, in one
// file of its own: validate, compile, take (admit or refuse), give back,
// what it holds, retake after a wait (align), and describe. The steps that
// run when rules load go through this table; the steps that run per
// request are methods in the kind's file that check.go calls by name, so
// that the per-request loop makes no indirect call per rule.
type kind struct {
	// is reports whether r is of this kind; a rule is of the first kind
	// in kinds that says so.
	is func(r *Rule) bool
	// validate checks what the kind adds to the checks every rule gets
	// (nil: nothing); r has its defaults.
	validate func(r *Rule, i int) error
	// compile adds the rule to the set being built.
	compile func(c *compiling)
	// describe is the kind's part of a rule's description (Rule.String),
	// after its metric and threshold.
	describe func(r *Rule) string
}

// kinds lists every rule kind, in the order they are told apart: a new
// kind is one file and one line here.
var kinds = [...]*kind{
	&breakerKind,
	&systemKind,
	&dryRunKind,
	&perKeyKind,
	&concurrencyKind,
	&relatedKind,
	&globalKind,
	&gcraKind,
	&pacedKind,
	&warmUpKind,
	&windowKind,
}

// kindOf returns the kind of rule r.
func kindOf(r *Rule) *kind {
	for _, k := range kinds {
		if k.is(r) {
			return k
		}
	}
	panic("flow: no kind takes the rule") // the window kind takes every rule
}
