package flow

type warmRule struct {
	w  *warmUp
	be *BlockError
}

var warmUpKind = kind{
	name:     "warm-up",
	is:       func(r *Rule) bool { return r.Behavior == WarmUp },
	compile:  compileWarmUp,
	describe: describeRate,
}

// compileWarmUp adds a WarmUp rule to its window's group: the group admits
// at the smallest of its rules' limits, a warm-up rule's at its rate now.
func compileWarmUp(c *compiling) {
	r := c.r
	g := c.rr.windowGroupOf(c.e, r)
	wu := reuse(c.old.warm, c.k, func() *warmUp { return newWarmUp(r) })
	c.next.warm[c.k] = wu
	g.warm = append(g.warm, warmRule{w: wu, be: newBlockError(r, ReasonFlow)})
	g.borrowable = false
}
