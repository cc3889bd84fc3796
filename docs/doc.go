// Package docs holds Orrery's user and design documentation (README.md at
// the repository's top and the pages in this directory) and the tests
// that keep it whole: every relative link in the repository's Markdown
// files must point to a file that exists, and every #anchor to a heading
// of its page.
package docs
