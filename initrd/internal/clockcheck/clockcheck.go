// Package clockcheck checks, before anything in the boot depends on time,
// that the kernel's clock runs at the rate of real time, and when it does
// not, moves the kernel to a clock source that does.
//
// Why: under QEMU's TCG, Linux calibrates the TSC's frequency at boot by
// counting it against the PIT or the HPET, and a busy host can disturb the
// count. A worker of a stress run came up believing its 2.3 GHz TSC ran at
// 274 MHz ("tsc: PIT calibration deviates from HPET: 273963 2300010",
// "Using PIT calibration value"), so its clock ran 8.4 times too fast:
// systemd's start timeouts fired early and, hours ahead after half an
// hour, it saw the join service's certificate as expired and never joined.
// The kernel's later refinement ignores a calibration more than 1% off,
// and tsc=reliable, without which the kernel never uses the TSC under TCG,
// also turns off the watchdog that would have noticed.
//
// The reference is the HPET: its counter follows the host's clock, and it
// is read in one MMIO access, so a short window measures the rate well.
// The fallback is the HPET as the clock source: slower to read, but right.
package clockcheck

import (
	"errors"
	"fmt"
	"time"
)

// Tolerance is how far the clock's rate may be from 1 before the check
// calls it wrong. Two samples bracketed within maxBracket over a Window
// measure the rate to 2% at worst; a miscalibrated TSC is off by a factor.
const Tolerance = 0.05

// Window is the time between the two samples, on the system clock.
const Window = 200 * time.Millisecond

// maxBracket bounds the system-clock time around one reference read: a
// sample whose reads were further apart (the vCPU was descheduled) is
// taken again. Many tries: a guest on a loaded host under TCG is
// descheduled often, and each try costs microseconds.
const maxBracket = 2 * time.Millisecond

const sampleTries = 50

// Reference is a free-running counter that keeps real time.
type Reference interface {
	// Ticks reads the counter.
	Ticks() uint64
	// PeriodFS is the length of one tick in femtoseconds.
	PeriodFS() uint64
	// Mask is the counter's width: it wraps after Mask.
	Mask() uint64
}

// Clock reads the system clock under test (CLOCK_MONOTONIC) as a duration
// since some fixed origin.
type Clock func() time.Duration

// Rate measures how fast clock runs against ref: 1 is right, 8 is eight
// times too fast. sleep waits on clock.
func Rate(ref Reference, clock Clock, sleep func(time.Duration)) (float64, error) {
	if ref.PeriodFS() == 0 {
		return 0, errors.New("the reference counter has no period")
	}
	c1, t1, err := sample(ref, clock)
	if err != nil {
		return 0, err
	}
	sleep(Window)
	c2, t2, err := sample(ref, clock)
	if err != nil {
		return 0, err
	}
	ticks := (t2 - t1) & ref.Mask()
	if ticks == 0 {
		return 0, errors.New("the reference counter does not count")
	}
	refNS := float64(ticks) * float64(ref.PeriodFS()) / 1e6
	if c2 <= c1 {
		return 0, fmt.Errorf("the system clock did not advance over %.0f ms of reference time", refNS/1e6)
	}
	return float64(c2-c1) / refNS, nil
}

// sample reads ref between two reads of clock and returns the midpoint;
// it retries when the reads were too far apart to pair them.
func sample(ref Reference, clock Clock) (time.Duration, uint64, error) {
	var widest time.Duration
	for i := 0; i < sampleTries; i++ {
		before := clock()
		ticks := ref.Ticks()
		after := clock()
		if d := after - before; d >= 0 && d <= maxBracket {
			return before + d/2, ticks, nil
		} else if d > widest {
			widest = d
		}
	}
	return 0, 0, fmt.Errorf("could not read the reference counter within %s of the system clock in %d tries (widest %s)", maxBracket, sampleTries, widest)
}

// Wrong reports whether a rate from Rate is outside Tolerance.
func Wrong(rate float64) bool {
	return rate < 1-Tolerance || rate > 1+Tolerance
}

// Describe says what a rate means, for the console.
func Describe(rate float64) string {
	switch {
	case !Wrong(rate):
		return fmt.Sprintf("runs at %.3fx real time", rate)
	case rate > 1:
		return fmt.Sprintf("runs %.2f times too fast", rate)
	default:
		return fmt.Sprintf("runs %.2f times too slow", 1/rate)
	}
}

// Result is what Check found and did.
type Result struct {
	// Source is the kernel's clock source when Check began.
	Source string
	// Rate is Source's rate against the HPET; 0 when not measured.
	Rate float64
	// Switched: the kernel now uses the HPET, at the rate After, and the
	// wall clock was set from the RTC to Time.
	Switched bool
	After    float64
	Time     time.Time
}

// Check measures the kernel's clock against the HPET when the clock
// source is the TSC (the only one whose rate the kernel guesses) and, when
// it is wrong, moves the kernel to the HPET and sets the wall clock from
// the RTC. An error means the clock was not checked, or not put right.
func Check() (Result, error) {
	src, err := CurrentSource(ClocksourceDir)
	if err != nil {
		return Result{}, err
	}
	res := Result{Source: src}
	if src != "tsc" && src != "tsc-early" {
		return res, nil
	}
	hpet, err := OpenHPET(HPETDevice)
	if err != nil {
		return res, fmt.Errorf("no HPET to check the TSC against: %w", err)
	}
	defer hpet.Close()
	if res.Rate, err = Rate(hpet, Monotonic, time.Sleep); err != nil || !Wrong(res.Rate) {
		return res, err
	}
	if err := UseSource(ClocksourceDir, "hpet"); err != nil {
		return res, fmt.Errorf("the clock %s and could not be moved to the HPET: %w", Describe(res.Rate), err)
	}
	res.Switched = true
	if res.After, err = Rate(hpet, Monotonic, time.Sleep); err != nil {
		return res, err
	}
	if Wrong(res.After) {
		return res, fmt.Errorf("the clock still %s on the HPET", Describe(res.After))
	}
	res.Time, err = SetTimeFromRTC(RTCDevice)
	return res, err
}
