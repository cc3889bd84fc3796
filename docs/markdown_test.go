package docs

import (
	"regexp"
	"sort"
	"strconv"
	"strings"
	"unicode"
)

// link is a link target and the line it is on.
type link struct {
	line   int
	target string
}

var (
	// inlineLink is [text](target) or ![alt](target), with an optional
	// title; the text may span lines.
	inlineLink = regexp.MustCompile(`!?\[[^\]]*\]\(\s*<?([^)\s>]*)>?(?:\s+"[^"]*")?\s*\)`)
	// refLink is a reference definition: [label]: target.
	refLink = regexp.MustCompile(`(?m)^ {0,3}\[[^\]]+\]:[ \t]*<?([^\s>]+)>?`)
	// atxHeading is "## Heading", with optional closing hashes.
	atxHeading = regexp.MustCompile(`^ {0,3}#{1,6}(?:[ \t]+(.*?))?(?:[ \t]+#+)?[ \t]*$`)
	// setextLine underlines the line before it as a heading.
	setextLine = regexp.MustCompile(`^ {0,3}(?:=+|-+)[ \t]*$`)
	// htmlAnchor is an anchor written in HTML: <a name="x"> or id="x".
	htmlAnchor = regexp.MustCompile(`\b(?:name|id)="([^"]+)"`)
	// textOfLink keeps a link's text, as GitHub renders a heading.
	textOfLink = regexp.MustCompile(`!?\[([^\]]*)\]\([^)]*\)`)
)

// links returns the link targets of a Markdown text, outside code blocks
// and code spans.
func links(text string) []link {
	prose := blankFences(text)
	lines := strings.SplitAfter(prose, "\n")
	for i, l := range lines {
		lines[i] = blankSpans(l)
	}
	prose = strings.Join(lines, "")
	var found []link
	for _, re := range []*regexp.Regexp{inlineLink, refLink} {
		for _, m := range re.FindAllStringSubmatchIndex(prose, -1) {
			if m[2] == m[3] {
				continue
			}
			found = append(found, link{line: 1 + strings.Count(prose[:m[0]], "\n"), target: prose[m[2]:m[3]]})
		}
	}
	sort.SliceStable(found, func(i, j int) bool { return found[i].line < found[j].line })
	return found
}

// anchors returns the anchors GitHub gives the headings of a Markdown
// text (a repeated heading's gets -1, -2, ...) and those written in HTML.
func anchors(text string) map[string]bool {
	a := map[string]bool{}
	count := map[string]int{}
	add := func(heading string) {
		s := slug(heading)
		if n := count[s]; n > 0 {
			a[s+"-"+strconv.Itoa(n)] = true
		} else {
			a[s] = true
		}
		count[s]++
	}
	lines := strings.Split(blankFences(text), "\n")
	for i, l := range lines {
		if m := atxHeading.FindStringSubmatch(l); m != nil {
			add(m[1])
		} else if i > 0 && setextLine.MatchString(l) && setextText(lines[i-1]) {
			add(lines[i-1])
		}
		for _, m := range htmlAnchor.FindAllStringSubmatch(l, -1) {
			a[strings.ToLower(m[1])] = true
		}
	}
	return a
}

// setextText says whether line can be the text of a setext heading: a
// paragraph's line, not a blank, a list item, a quote or a table row.
func setextText(line string) bool {
	t := strings.TrimSpace(line)
	return t != "" && !strings.ContainsAny(t[:1], "#-*+>|") && !atxHeading.MatchString(line)
}

// slug is the anchor GitHub gives a heading: its text lowercased, spaces
// turned into '-', and every character but letters, digits, '-' and '_'
// dropped.
func slug(heading string) string {
	heading = strings.TrimSpace(textOfLink.ReplaceAllString(heading, "$1"))
	var b strings.Builder
	for _, r := range strings.ToLower(heading) {
		switch {
		case unicode.IsLetter(r), unicode.IsNumber(r), r == '-', r == '_':
			b.WriteRune(r)
		case r == ' ':
			b.WriteRune('-')
		}
	}
	return b.String()
}

// fence opens or closes a fenced code block.
var fence = regexp.MustCompile("^ {0,3}(`{3,}|~{3,})")

// blankFences replaces the lines of fenced code blocks with empty lines,
// so that line numbers stay as they were.
func blankFences(text string) string {
	lines := strings.Split(text, "\n")
	open := ""
	for i, l := range lines {
		m := fence.FindStringSubmatch(l)
		switch {
		case open == "" && m != nil:
			open = m[1]
		case open != "" && m != nil && m[1][0] == open[0] && len(m[1]) >= len(open) &&
			strings.TrimSpace(strings.TrimLeft(l, " "+open[:1])) == "":
			open = ""
		case open == "":
			continue
		}
		lines[i] = ""
	}
	return strings.Join(lines, "\n")
}

// blankSpans replaces the code spans of a line (`code`, “co`de“) with
// spaces.
func blankSpans(line string) string {
	b := []byte(line)
	for i := 0; i < len(b); {
		if b[i] != '`' {
			i++
			continue
		}
		n := 0
		for i+n < len(b) && b[i+n] == '`' {
			n++
		}
		end := closingRun(b, i+n, n)
		if end < 0 {
			i += n
			continue
		}
		for j := i; j < end+n; j++ {
			b[j] = ' '
		}
		i = end + n
	}
	return string(b)
}

// closingRun returns where a run of exactly n backticks starts at or after
// from, or -1.
func closingRun(b []byte, from, n int) int {
	for i := from; i < len(b); {
		if b[i] != '`' {
			i++
			continue
		}
		m := 0
		for i+m < len(b) && b[i+m] == '`' {
			m++
		}
		if m == n {
			return i
		}
		i += m
	}
	return -1
}
