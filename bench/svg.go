package main

import (
	"fmt"
	"html"
	"io"
	"math"
	"strings"
	"unicode/utf8"
)

// palette gives each series a distinct colour.
var palette = []string{"#d62728", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#1f77b4", "#2ca02c", "#17becf", "#bcbd22", "#7f7f7f", "#393b79", "#637939"}

type series struct {
	name   string
	points []float64 // one per x, 0 for none
}

// lineChart draws series against categorical x values on a log y axis.
func lineChart(w io.Writer, title, yLabel string, xs []string, ss []series) error {
	const width, height, left, right, top, bottom = 860, 440, 70, 190, 40, 50
	pw, ph := float64(width-left-right), float64(height-top-bottom)
	lo, hi := math.Inf(1), math.Inf(-1)
	for _, s := range ss {
		for _, v := range s.points {
			if v > 0 {
				lo, hi = math.Min(lo, v), math.Max(hi, v)
			}
		}
	}
	if math.IsInf(lo, 0) {
		lo, hi = 1, 10
	}
	lo, hi = math.Pow(10, math.Floor(math.Log10(lo))), math.Pow(10, math.Ceil(math.Log10(hi)))
	if hi <= lo {
		hi = lo * 10
	}
	y := func(v float64) float64 {
		return float64(top) + ph*(1-(math.Log10(v)-math.Log10(lo))/(math.Log10(hi)-math.Log10(lo)))
	}
	x := func(i int) float64 {
		if len(xs) == 1 {
			return float64(left) + pw/2
		}
		return float64(left) + pw*float64(i)/float64(len(xs)-1)
	}
	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="sans-serif" font-size="12">`+"\n", width, height, width, height)
	fmt.Fprintf(&b, `<rect width="100%%" height="100%%" fill="white"/>`+"\n")
	fmt.Fprintf(&b, `<text x="%d" y="22" font-size="15" font-weight="bold">%s</text>`+"\n", left, html.EscapeString(title))
	for d := lo; d <= hi*1.0001; d *= 10 {
		fmt.Fprintf(&b, `<line x1="%d" x2="%.1f" y1="%.1f" y2="%.1f" stroke="#ddd"/>`+"\n", left, float64(left)+pw, y(d), y(d))
		fmt.Fprintf(&b, `<text x="%d" y="%.1f" text-anchor="end">%s</text>`+"\n", left-6, y(d)+4, trimFloat(d))
	}
	for i, xv := range xs {
		fmt.Fprintf(&b, `<text x="%.1f" y="%d" text-anchor="middle">%s</text>`+"\n", x(i), height-bottom+18, html.EscapeString(xv))
	}
	fmt.Fprintf(&b, `<text x="%.1f" y="%d" text-anchor="middle">goroutines</text>`+"\n", float64(left)+pw/2, height-8)
	fmt.Fprintf(&b, `<text transform="translate(16 %.1f) rotate(-90)" text-anchor="middle">%s</text>`+"\n", float64(top)+ph/2, html.EscapeString(yLabel))
	for si, s := range ss {
		c := palette[si%len(palette)]
		var pts []string
		for i, v := range s.points {
			if v > 0 {
				pts = append(pts, fmt.Sprintf("%.1f,%.1f", x(i), y(v)))
				fmt.Fprintf(&b, `<circle cx="%.1f" cy="%.1f" r="3" fill="%s"/>`+"\n", x(i), y(v), c)
			}
		}
		if len(pts) > 1 {
			width := 2
			if si == 0 {
				width = 4 // the first series is the subject: leapflow
			}
			fmt.Fprintf(&b, `<polyline fill="none" stroke="%s" stroke-width="%d" points="%s"/>`+"\n", c, width, strings.Join(pts, " "))
		}
		ly := top + 10 + si*18
		fmt.Fprintf(&b, `<rect x="%d" y="%d" width="12" height="12" fill="%s"/>`+"\n", width-right+12, ly-10, c)
		fmt.Fprintf(&b, `<text x="%d" y="%d">%s</text>`+"\n", width-right+30, ly, html.EscapeString(s.name))
	}
	b.WriteString("</svg>\n")
	_, err := io.WriteString(w, b.String())
	return err
}

// barChart draws groups of bars (one per series) per category, with a
// dashed reference line.
func barChart(w io.Writer, title, yLabel string, cats []string, ss []series, ref float64, refLabel string) error {
	const width, left, right, top = 860, 70, 190, 40
	pw := float64(width - left - right)
	// Category labels that would overlap side by side are turned 40°,
	// with room below the bars for the longest.
	tilt, bottom := labelLayout(cats, pw/float64(max(len(cats), 1)))
	height := 380 + bottom
	ph := float64(height - top - bottom)
	hi := ref
	for _, s := range ss {
		for _, v := range s.points {
			hi = math.Max(hi, v)
		}
	}
	hi *= 1.1
	if hi <= 0 {
		hi = 1
	}
	y := func(v float64) float64 { return float64(top) + ph*(1-v/hi) }
	gw := pw / float64(len(cats))
	bw := gw * 0.8 / float64(max(len(ss), 1))
	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="sans-serif" font-size="12">`+"\n", width, height, width, height)
	fmt.Fprintf(&b, `<rect width="100%%" height="100%%" fill="white"/>`+"\n")
	fmt.Fprintf(&b, `<text x="%d" y="22" font-size="15" font-weight="bold">%s</text>`+"\n", left, html.EscapeString(title))
	for k := 0; k <= 4; k++ {
		v := hi * float64(k) / 4
		fmt.Fprintf(&b, `<line x1="%d" x2="%.1f" y1="%.1f" y2="%.1f" stroke="#eee"/>`+"\n", left, float64(left)+pw, y(v), y(v))
		fmt.Fprintf(&b, `<text x="%d" y="%.1f" text-anchor="end">%s</text>`+"\n", left-6, y(v)+4, trimFloat(math.Round(v)))
	}
	for ci, cat := range cats {
		gx := float64(left) + gw*float64(ci) + gw*0.1
		for si, s := range ss {
			v := s.points[ci]
			fmt.Fprintf(&b, `<rect x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="%s"><title>%s %s: %s</title></rect>`+"\n",
				gx+bw*float64(si), y(v), bw-1, float64(top)+ph-y(v), palette[si%len(palette)],
				html.EscapeString(cat), html.EscapeString(s.name), trimFloat(v))
		}
		cx, cy := float64(left)+gw*(float64(ci)+0.5), height-bottom+18
		if tilt {
			fmt.Fprintf(&b, `<text x="%.1f" y="%d" text-anchor="end" transform="rotate(-%d %.1f %d)">%s</text>`+"\n", cx, cy, labelTilt, cx, cy, html.EscapeString(cat))
		} else {
			fmt.Fprintf(&b, `<text x="%.1f" y="%d" text-anchor="middle">%s</text>`+"\n", cx, cy, html.EscapeString(cat))
		}
	}
	if ref > 0 {
		fmt.Fprintf(&b, `<line x1="%d" x2="%.1f" y1="%.1f" y2="%.1f" stroke="black" stroke-dasharray="6 4"/>`+"\n", left, float64(left)+pw, y(ref), y(ref))
		fmt.Fprintf(&b, `<text x="%.1f" y="%.1f">%s</text>`+"\n", float64(left)+pw+4, y(ref)+4, html.EscapeString(refLabel))
	}
	fmt.Fprintf(&b, `<text transform="translate(16 %.1f) rotate(-90)" text-anchor="middle">%s</text>`+"\n", float64(top)+ph/2, html.EscapeString(yLabel))
	for si, s := range ss {
		ly := top + 30 + si*18
		fmt.Fprintf(&b, `<rect x="%d" y="%d" width="12" height="12" fill="%s"/>`+"\n", width-right+12, ly-10, palette[si%len(palette)])
		fmt.Fprintf(&b, `<text x="%d" y="%d">%s</text>`+"\n", width-right+30, ly, html.EscapeString(s.name))
	}
	b.WriteString("</svg>\n")
	_, err := io.WriteString(w, b.String())
	return err
}

// labelTilt is the angle, in degrees, of category labels that would
// overlap side by side.
const labelTilt = 40

// labelWidth is the width of a label at font size 12, in pixels (an upper
// bound for sans-serif: 7 px a character).
func labelWidth(s string) float64 { return 7 * float64(utf8.RuneCountInString(s)) }

// labelLayout says whether labels spaced gap apart must be tilted, and the
// room below the bars they need.
func labelLayout(cats []string, gap float64) (tilt bool, bottom int) {
	widest := 0.0
	for _, c := range cats {
		widest = max(widest, labelWidth(c))
	}
	if widest <= 0.9*gap {
		return false, 60
	}
	return true, 30 + int(math.Ceil(widest*math.Sin(labelTilt*math.Pi/180)))
}

func trimFloat(v float64) string {
	s := fmt.Sprintf("%.3g", v)
	if strings.ContainsAny(s, "e") {
		s = fmt.Sprintf("%.0f", v)
	}
	return s
}
