//go:build e2e

package e2e

import (
	"strings"
	"time"
)

// phase is one row of the suite's timing table.
type phase struct {
	name string
	took time.Duration
}

// initSteps reads the table of steps that 'orrery init' prints when done
// ("Time per step:", then one indented "name  duration" line each).
func initSteps(out string) []phase {
	var rows []phase
	_, table, ok := strings.Cut(out, "Time per step:\n")
	if !ok {
		return nil
	}
	for _, line := range strings.Split(table, "\n") {
		if !strings.HasPrefix(line, "    ") {
			break
		}
		i := strings.LastIndex(strings.TrimRight(line, " "), "  ")
		if i < 0 {
			continue
		}
		d, err := time.ParseDuration(strings.TrimSpace(line[i:]))
		if err != nil {
			continue
		}
		rows = append(rows, phase{name: "  init: " + strings.TrimSpace(line[:i]), took: d})
	}
	return rows
}
