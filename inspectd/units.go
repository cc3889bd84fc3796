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
		// A unit that vanishes between the list and this call keeps
		// what the list said.
		if props, err := conn.GetUnitPropertiesContext(ctx, s.Name); err == nil {
			u.SinceUnixMicros = int64(since(props, s.ActiveState))
		}
		if strings.HasSuffix(s.Name, ".service") {
			if props, err := conn.GetUnitTypePropertiesContext(ctx, s.Name, "Service"); err == nil {
				u.MainPid, _ = props["MainPID"].(uint32)
				u.Restarts, _ = props["NRestarts"].(uint32)
				u.Result, _ = props["Result"].(string)
			}
		}
		units = append(units, u)
	}
	slices.SortFunc(units, func(a, b *inspectpb.Unit) int { return strings.Compare(a.Name, b.Name) })
	return units, nil
}

// since is the time a unit entered its current state, as systemctl status
// shows it ("active (running) since ...").
func since(props map[string]any, activeState string) uint64 {
	key := "InactiveEnterTimestamp"
	switch activeState {
	case "active", "reloading":
		key = "ActiveEnterTimestamp"
	case "activating":
		key = "InactiveExitTimestamp"
	case "deactivating":
		key = "ActiveExitTimestamp"
	}
	t, _ := props[key].(uint64)
	return t
}
