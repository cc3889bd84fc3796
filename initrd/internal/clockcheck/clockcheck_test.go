package clockcheck

import (
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// fakeTime is real time for a fake HPET and a system clock that runs at
// rate times real time. Each clock read costs readCost of real time.
type fakeTime struct {
	real     time.Duration
	rate     float64
	readCost time.Duration
	// stalls: real time lost inside the next HPET reads (a descheduled
	// vCPU), one entry per read.
	stalls []time.Duration
	period uint64 // fs
	mask   uint64
	offset uint64 // the counter's value at real time 0
}

func (f *fakeTime) Ticks() uint64 {
	if len(f.stalls) > 0 {
		f.real += f.stalls[0]
		f.stalls = f.stalls[1:]
	}
	return (f.offset + uint64(f.real.Nanoseconds())*1e6/f.period) & f.mask
}
func (f *fakeTime) PeriodFS() uint64 { return f.period }
func (f *fakeTime) Mask() uint64     { return f.mask }

func (f *fakeTime) clock() time.Duration {
	f.real += f.readCost
	return time.Duration(float64(f.real) * f.rate)
}

// sleep waits d on the system clock.
func (f *fakeTime) sleep(d time.Duration) { f.real += time.Duration(float64(d) / f.rate) }

func newFake(rate float64) *fakeTime {
	return &fakeTime{rate: rate, readCost: 2 * time.Microsecond, period: 10_000_000, mask: ^uint64(0)}
}

func TestRate(t *testing.T) {
	for _, tc := range []struct {
		name  string
		rate  float64
		wrong bool
	}{
		{"right", 1, false},
		{"a little fast, within tolerance", 1.02, false},
		// The stress run's worker: 2300 MHz taken for 274 MHz.
		{"miscalibrated fast", 2300.010 / 273.963, true},
		{"miscalibrated slow", 0.5, true},
		{"just outside tolerance", 1.08, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFake(tc.rate)
			got, err := Rate(f, f.clock, f.sleep)
			if err != nil {
				t.Fatal(err)
			}
			if math.Abs(got-tc.rate)/tc.rate > 0.001 {
				t.Errorf("Rate = %.4f, want %.4f", got, tc.rate)
			}
			if Wrong(got) != tc.wrong {
				t.Errorf("Wrong(%.4f) = %v, want %v", got, Wrong(got), tc.wrong)
			}
		})
	}
}

func TestRateCounterWraps(t *testing.T) {
	f := newFake(1)
	f.mask = 1<<32 - 1
	f.offset = 1<<32 - 1000 // wraps inside the window
	got, err := Rate(f, f.clock, f.sleep)
	if err != nil || math.Abs(got-1) > 0.001 {
		t.Fatalf("Rate over a 32-bit wrap = %v, %v; want 1", got, err)
	}
}

// A read interrupted by a stall is taken again, so the stall does not
// bias the rate; reads that always stall give an error, not a rate.
func TestRateRetriesStalledReads(t *testing.T) {
	f := newFake(1)
	f.stalls = []time.Duration{50 * time.Millisecond, 30 * time.Millisecond}
	got, err := Rate(f, f.clock, f.sleep)
	if err != nil || math.Abs(got-1) > 0.01 {
		t.Fatalf("Rate with two stalled reads = %v, %v; want 1", got, err)
	}

	f = newFake(1)
	for i := 0; i < sampleTries; i++ {
		f.stalls = append(f.stalls, 5*time.Millisecond)
	}
	if got, err := Rate(f, f.clock, f.sleep); err == nil || !strings.Contains(err.Error(), "could not read the reference") {
		t.Fatalf("Rate with every read stalled = %v, %v; want an error", got, err)
	}
}

func TestRateRefusesBrokenReferences(t *testing.T) {
	f := newFake(1)
	f.period = 0
	if _, err := Rate(f, f.clock, f.sleep); err == nil {
		t.Error("no error for a counter without a period")
	}
	f = newFake(1)
	f.mask = 0 // a counter that never moves
	if _, err := Rate(f, f.clock, f.sleep); err == nil || !strings.Contains(err.Error(), "does not count") {
		t.Errorf("stopped counter: %v", err)
	}
	f = newFake(1)
	stopped := func() time.Duration { return time.Second }
	if _, err := Rate(f, stopped, f.sleep); err == nil || !strings.Contains(err.Error(), "did not advance") {
		t.Errorf("stopped system clock: %v", err)
	}
}

func TestDescribe(t *testing.T) {
	for rate, want := range map[float64]string{
		1.0012: "runs at 1.001x real time",
		8.4:    "runs 8.40 times too fast",
		0.25:   "runs 4.00 times too slow",
	} {
		if got := Describe(rate); got != want {
			t.Errorf("Describe(%v) = %q, want %q", rate, got, want)
		}
	}
}

func TestParseCapabilities(t *testing.T) {
	// QEMU's HPET: 10 ns ticks, 64-bit counter, vendor 0x8086, 3 timers.
	period, mask, err := parseCapabilities(0x00989680_8086a201)
	if err != nil || period != 10_000_000 || mask != ^uint64(0) {
		t.Errorf("QEMU's HPET: period %d fs, mask %#x, %v", period, mask, err)
	}
	period, mask, err = parseCapabilities(0x00989680_8086c201 &^ hpetCount64)
	if err != nil || period != 10_000_000 || mask != 1<<32-1 {
		t.Errorf("32-bit HPET: period %d fs, mask %#x, %v", period, mask, err)
	}
	for _, caps := range []uint64{0, 0x00000000_8086a201, 0x05f5e101_8086a201, ^uint64(0)} {
		if _, _, err := parseCapabilities(caps); err == nil {
			t.Errorf("capabilities %#x accepted", caps)
		}
	}
}

func TestRTCTime(t *testing.T) {
	got, err := rtcTime(&unix.RTCTime{Year: 126, Mon: 10, Mday: 26, Hour: 1, Min: 31, Sec: 10})
	if want := time.Date(2026, time.November, 26, 1, 31, 10, 0, time.UTC); err != nil || !got.Equal(want) {
		t.Errorf("rtcTime = %v, %v; want %v", got, err, want)
	}
	for _, bad := range []unix.RTCTime{
		{Year: 70, Mon: 0, Mday: 1},            // 1970: an RTC never set
		{Year: 400, Mon: 1, Mday: 1},           // 2300
		{Year: 126, Mon: 12, Mday: 1},          // month 13
		{Year: 126, Mon: -1, Mday: 1},          // month 0
		{Year: 126, Mon: 1, Mday: 0},           // day 0
		{Year: 126, Mon: 1, Mday: 32},          // day 32
		{Year: 126, Mon: 1, Mday: 1, Hour: 24}, // hour 24
		{Year: 126, Mon: 1, Mday: 1, Min: 60},  // minute 60
		{Year: 126, Mon: 1, Mday: 1, Sec: 61},  // past a leap second
		{Year: 126, Mon: 1, Mday: 1, Sec: -1},  // garbage
	} {
		if got, err := rtcTime(&bad); err == nil {
			t.Errorf("rtcTime(%+v) = %v, want an error", bad, got)
		}
	}
}

// UseSource against a directory laid out as the kernel's clocksource0.
func TestUseSource(t *testing.T) {
	dir := t.TempDir()
	write := func(name, s string) {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("available_clocksource", "tsc hpet acpi_pm \n")
	write("current_clocksource", "tsc\n")
	if src, err := CurrentSource(dir); err != nil || src != "tsc" {
		t.Fatalf("CurrentSource = %q, %v", src, err)
	}
	if err := UseSource(dir, "kvm-clock"); err == nil || !strings.Contains(err.Error(), "no clock source \"kvm-clock\"") {
		t.Errorf("UseSource of a source the kernel lacks: %v", err)
	}
	if src, _ := CurrentSource(dir); src != "tsc" {
		t.Errorf("a refused switch changed the source to %q", src)
	}
	if err := UseSource(dir, "hpet"); err != nil {
		t.Fatal(err)
	}
	if src, _ := CurrentSource(dir); src != "hpet" {
		t.Errorf("after UseSource(hpet) the source is %q", src)
	}
	if err := UseSource(filepath.Join(dir, "missing"), "hpet"); err == nil {
		t.Error("UseSource without the kernel's files: no error")
	}
}
