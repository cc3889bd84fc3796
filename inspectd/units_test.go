package main

import (
	"context"
	"errors"
	"testing"

	sdbus "github.com/coreos/go-systemd/v22/dbus"
	"github.com/godbus/dbus/v5"
)

// property takes a value of the type asked for, and nothing from a unit
// that vanished or a property of another type.
func TestProperty(t *testing.T) {
	get := func(_ context.Context, unit, name string) (*sdbus.Property, error) {
		if unit == "gone.service" {
			return nil, errors.New("unit gone.service not loaded")
		}
		return &sdbus.Property{Name: name, Value: dbus.MakeVariant(uint32(42))}, nil
	}
	if v, ok := property[uint32](context.Background(), get, "kubelet.service", "MainPID"); !ok || v != 42 {
		t.Errorf("MainPID = %d, %v; want 42", v, ok)
	}
	if _, ok := property[uint32](context.Background(), get, "gone.service", "MainPID"); ok {
		t.Error("a vanished unit gave a value")
	}
	if v, ok := property[string](context.Background(), get, "kubelet.service", "Result"); ok || v != "" {
		t.Errorf("a uint32 read as the string %q", v)
	}
}

func TestSinceProperty(t *testing.T) {
	for state, want := range map[string]string{
		"active": "ActiveEnterTimestamp", "reloading": "ActiveEnterTimestamp", "activating": "InactiveExitTimestamp",
		"deactivating": "ActiveExitTimestamp", "inactive": "InactiveEnterTimestamp", "failed": "InactiveEnterTimestamp",
	} {
		if got := sinceProperty(state); got != want {
			t.Errorf("sinceProperty(%q) = %s, want %s", state, got, want)
		}
	}
}
