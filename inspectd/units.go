package main

import (
	"context"
	"fmt"
	"slices"
	"strings"

	sdbus "github.com/coreos/go-systemd/v22/dbus"

	"github.com/orrery-dev/orrery/internal/proto/inspectpb"
)

// maxUnits caps a Units answer; a node loads about two hundred.
const maxUnits = 4096

// systemdUnits lists units through systemd's D-Bus API on the system bus, where
// reading a unit's state needs no privilege.
type systemdUnits struct{}

// Units returns the loaded units whose names match pattern (every unit if
// it is empty), sorted by name.
func (systemdUnits) Units(ctx context.Context, pattern string) ([]*inspectpb.Unit, error) {
	conn, err := sdbus.NewSystemConnectionContext(ctx)
	if err != nil {
		return nil, fmt.Errorf("connect to systemd over D-Bus: %w", err)
	}
	defer conn.Close()
	var patterns []string
	if pattern != "" {
		patterns = []string{pattern}
	}
	list, err := conn.ListUnitsByPatternsContext(ctx, nil, patterns)
	if err != nil {
		return nil, fmt.Errorf("list systemd units: %w", err)
	}
	if len(list) > maxUnits {
		list = list[:maxUnits]
	}
	units := make([]*inspectpb.Unit, 0, len(list))
	for _, s := range list {
		u := &inspectpb.Unit{Name: s.Name, Description: s.Description, LoadState: s.LoadState, ActiveState: s.ActiveState, SubState: s.SubState}
		// One property at a time: GetAll makes systemd compute every
		// property of the unit, cgroup counters included, which took a
		// starved worker about half a second a unit. A unit that
		// vanishes between the list and these calls keeps what the list
		// said.
		if v, ok := property[uint64](ctx, conn.GetUnitPropertyContext, s.Name, sinceProperty(s.ActiveState)); ok {
			u.SinceUnixMicros = int64(v)
		}
		if strings.HasSuffix(s.Name, ".service") {
			u.MainPid, _ = property[uint32](ctx, conn.GetServicePropertyContext, s.Name, "MainPID")
			u.Restarts, _ = property[uint32](ctx, conn.GetServicePropertyContext, s.Name, "NRestarts")
			u.Result, _ = property[string](ctx, conn.GetServicePropertyContext, s.Name, "Result")
		}
		units = append(units, u)
	}
	slices.SortFunc(units, func(a, b *inspectpb.Unit) int { return strings.Compare(a.Name, b.Name) })
	return units, nil
}

// property reads one property of unit with get, if it has the type T.
func property[T any](ctx context.Context, get func(context.Context, string, string) (*sdbus.Property, error), unit, name string) (T, bool) {
	var zero T
	p, err := get(ctx, unit, name)
	if err != nil {
		return zero, false
	}
	v, ok := p.Value.Value().(T)
	return v, ok
}

// sinceProperty names the timestamp of when a unit entered its current
// state, as systemctl status shows it ("active (running) since ...").
func sinceProperty(activeState string) string {
	switch activeState {
	case "active", "reloading":
		return "ActiveEnterTimestamp"
	case "activating":
		return "InactiveExitTimestamp"
	case "deactivating":
		return "ActiveExitTimestamp"
	}
	return "InactiveEnterTimestamp"
}
