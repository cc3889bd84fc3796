package docs

import (
	"io/fs"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// TestRepositoryLinks fails for each relative link in a Markdown file of
// the repository whose file does not exist, or whose #anchor names no
// heading of its page: a reader who follows it finds nothing.
func TestRepositoryLinks(t *testing.T) {
	root := ".."
	files, err := markdownFiles(root)
	if err != nil {
		t.Fatal(err)
	}
	seen := strings.Join(files, " ")
	for _, want := range []string{"README.md", "docs/architecture.md", "docs/performance.md", "docs/security.md"} {
		if !strings.Contains(" "+seen+" ", " "+want+" ") {
			t.Fatalf("%s not among the Markdown files found (%s): is the walk rooted right?", want, seen)
		}
	}
	c := newChecker(root)
	for _, f := range files {
		for _, p := range c.check(f) {
			t.Error(p)
		}
	}
}

// TestBrokenLinksAreFound checks the checker on pages with known faults.
func TestBrokenLinksAreFound(t *testing.T) {
	root := t.TempDir()
	write := func(name, text string) {
		t.Helper()
		path := filepath.Join(root, name)
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("README.md", "# Top\n\n"+
		"[ok](docs/page.md) and [gone](docs/missing.md).\n"+
		"[anchor](docs/page.md#the-orrery-init-step) [bad anchor](docs/page.md#nowhere)\n"+
		"[web](https://example.com/x.md) [mail](mailto:a@b.c) [here](#top) [not here](#bottom)\n"+
		"`[code](gone.md)` and ![image](docs/img.png)\n"+
		"```\n[fenced](gone.md)\n```\n"+
		"[up](../outside.md) [twice](docs/page.md#details-1)\n"+
		"[ref]: docs/also-missing.md\n")
	write("docs/page.md", "## The `orrery init` step!\n\n### Details\n\n### Details\n\n[back](../README.md#top)\n")
	files, err := markdownFiles(root)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	c := newChecker(root)
	for _, f := range files {
		got = append(got, c.check(f)...)
	}
	want := []string{
		"README.md:3: docs/missing.md: no such file",
		"README.md:4: docs/page.md#nowhere: docs/page.md has no heading with the anchor #nowhere",
		"README.md:5: #bottom: README.md has no heading with the anchor #bottom",
		"README.md:6: docs/img.png: no such file",
		"README.md:10: ../outside.md: points outside the repository",
		"README.md:11: docs/also-missing.md: no such file",
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("problems found:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

func TestSlug(t *testing.T) {
	for heading, want := range map[string]string{
		"Bring up a local cluster":                 "bring-up-a-local-cluster",
		"`orrery init` (bootstrapperd, port 9000)": "orrery-init-bootstrapperd-port-9000",
		"Attestation and attested TLS":             "attestation-and-attested-tls",
		"containerd's exit handling: 60 s, not 10": "containerds-exit-handling-60-s-not-10",
		"Keys: [the master secret](x.md) & more":   "keys-the-master-secret--more",
		"snake_case and hy-phen":                   "snake_case-and-hy-phen",
		"Ünïcode letters stay":                     "ünïcode-letters-stay",
	} {
		if got := slug(heading); got != want {
			t.Errorf("slug(%q) = %q, want %q", heading, got, want)
		}
	}
}

// markdownFiles lists the *.md files under root, relative to it, leaving
// out build outputs and hidden directories (.git).
func markdownFiles(root string) ([]string, error) {
	var files []string
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		name := d.Name()
		if d.IsDir() && path != root && (name == "build" || name == "node_modules" || strings.HasPrefix(name, ".")) {
			return filepath.SkipDir
		}
		if !d.IsDir() && strings.HasSuffix(name, ".md") {
			rel, err := filepath.Rel(root, path)
			if err != nil {
				return err
			}
			files = append(files, filepath.ToSlash(rel))
		}
		return nil
	})
	return files, err
}

// checker checks the links of a repository's pages, reading each linked
// page's headings once.
type checker struct {
	root    string
	anchors map[string]map[string]bool // by page, relative to root
}

func newChecker(root string) *checker {
	return &checker{root: root, anchors: map[string]map[string]bool{}}
}

// scheme matches a link with a scheme (https:, mailto:), which the check
// leaves alone: only links within the repository are checked.
var scheme = regexp.MustCompile(`^[a-zA-Z][a-zA-Z0-9+.-]*:`)

// check returns a line "file:line: target: problem" for each broken link
// of file (relative to the root).
func (c *checker) check(file string) []string {
	raw, err := os.ReadFile(filepath.Join(c.root, file))
	if err != nil {
		return []string{file + ": " + err.Error()}
	}
	var problems []string
	for _, l := range links(string(raw)) {
		if scheme.MatchString(l.target) || strings.HasPrefix(l.target, "//") {
			continue
		}
		if p := c.problem(file, l.target); p != "" {
			problems = append(problems, file+":"+strconv.Itoa(l.line)+": "+l.target+": "+p)
		}
	}
	return problems
}

// problem says what is wrong with a relative link target of file, or "".
func (c *checker) problem(file, target string) string {
	path, anchor, _ := strings.Cut(target, "#")
	path, err := url.PathUnescape(path)
	if err != nil {
		return "not a valid path: " + err.Error()
	}
	dest := file
	switch {
	case strings.HasPrefix(path, "/"):
		dest = filepath.ToSlash(filepath.Clean(strings.TrimPrefix(path, "/")))
	case path != "":
		dest = filepath.ToSlash(filepath.Join(filepath.Dir(file), path))
	}
	if dest == ".." || strings.HasPrefix(dest, "../") {
		return "points outside the repository"
	}
	info, err := os.Stat(filepath.Join(c.root, dest))
	if err != nil {
		return "no such file"
	}
	if anchor == "" || info.IsDir() || !strings.HasSuffix(dest, ".md") {
		return ""
	}
	if !c.headings(dest)[strings.ToLower(anchor)] {
		return dest + " has no heading with the anchor #" + anchor
	}
	return ""
}

// headings returns the anchors of page's headings, read once.
func (c *checker) headings(page string) map[string]bool {
	if a, ok := c.anchors[page]; ok {
		return a
	}
	raw, _ := os.ReadFile(filepath.Join(c.root, page))
	a := anchors(string(raw))
	c.anchors[page] = a
	return a
}
