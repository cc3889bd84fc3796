package clockcheck

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Paths of the kernel's interfaces; tests point them elsewhere.
const (
	HPETDevice     = "/dev/hpet"
	RTCDevice      = "/dev/rtc0"
	ClocksourceDir = "/sys/devices/system/clocksource/clocksource0"
)

// HPET register offsets and fields (IA-PC HPET specification 1.0a, 2.3).
const (
	hpetCapabilities = 0x00
	hpetMainCounter  = 0xf0
	// The capabilities' bit 13: the main counter is 64 bits wide.
	hpetCount64 = 1 << 13
	// The specification's longest tick: 100 ns.
	hpetMaxPeriodFS = 100_000_000
)

// HPET is the HPET's main counter, mapped read-only through the kernel's
// hpet driver.
type HPET struct {
	regs   []byte
	period uint64
	mask   uint64
}

// OpenHPET maps the HPET's registers from dev (HPETDevice).
func OpenHPET(dev string) (*HPET, error) {
	// The driver refuses a writable open and maps exactly one page.
	f, err := os.OpenFile(dev, os.O_RDONLY, 0)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	regs, err := unix.Mmap(int(f.Fd()), 0, os.Getpagesize(), unix.PROT_READ, unix.MAP_SHARED)
	if err != nil {
		return nil, fmt.Errorf("map %s: %w (the kernel needs CONFIG_HPET_MMAP)", dev, err)
	}
	h := &HPET{regs: regs}
	h.period, h.mask, err = parseCapabilities(h.load(hpetCapabilities))
	if err != nil {
		h.Close()
		return nil, err
	}
	return h, nil
}

// parseCapabilities returns the tick period and counter mask from the
// HPET's general capabilities register.
func parseCapabilities(caps uint64) (periodFS, mask uint64, err error) {
	periodFS = caps >> 32
	if periodFS == 0 || periodFS > hpetMaxPeriodFS {
		return 0, 0, fmt.Errorf("the HPET reports a tick of %d fs, outside the specification's 1-%d", periodFS, hpetMaxPeriodFS)
	}
	mask = uint64(1)<<32 - 1
	if caps&hpetCount64 != 0 {
		mask = ^uint64(0)
	}
	return periodFS, mask, nil
}

func (h *HPET) load(off int) uint64 {
	return atomic.LoadUint64((*uint64)(unsafe.Pointer(&h.regs[off])))
}

func (h *HPET) Ticks() uint64    { return h.load(hpetMainCounter) & h.mask }
func (h *HPET) PeriodFS() uint64 { return h.period }
func (h *HPET) Mask() uint64     { return h.mask }

// Close unmaps the registers.
func (h *HPET) Close() error { return unix.Munmap(h.regs) }

// Monotonic reads CLOCK_MONOTONIC, the clock that the kernel's clock
// source drives.
func Monotonic() time.Duration {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
		return 0 // cannot fail for CLOCK_MONOTONIC; 0 fails Rate
	}
	return time.Duration(ts.Nano())
}

// CurrentSource returns the kernel's clock source ("tsc", "hpet", ...)
// from dir (ClocksourceDir).
func CurrentSource(dir string) (string, error) {
	b, err := os.ReadFile(dir + "/current_clocksource")
	return strings.TrimSpace(string(b)), err
}

// UseSource makes name the kernel's clock source and checks that it took.
func UseSource(dir, name string) error {
	avail, err := os.ReadFile(dir + "/available_clocksource")
	if err != nil {
		return err
	}
	if !contains(strings.Fields(string(avail)), name) {
		return fmt.Errorf("the kernel offers no clock source %q (it has: %s)", name, strings.TrimSpace(string(avail)))
	}
	if err := os.WriteFile(dir+"/current_clocksource", []byte(name+"\n"), 0o644); err != nil {
		return err
	}
	if got, err := CurrentSource(dir); err != nil {
		return err
	} else if got != name {
		return fmt.Errorf("asked for clock source %q, the kernel uses %q", name, got)
	}
	return nil
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// SetTimeFromRTC sets the system's wall clock from the real-time clock dev
// (RTCDevice), as the kernel did at boot, and returns the time it set.
// A clock that ran too fast since boot is ahead by then; the RTC, kept by
// the host, is not.
func SetTimeFromRTC(dev string) (time.Time, error) {
	f, err := os.Open(dev)
	if err != nil {
		return time.Time{}, err
	}
	defer f.Close()
	rt, err := unix.IoctlGetRTCTime(int(f.Fd()))
	if err != nil {
		return time.Time{}, fmt.Errorf("read %s: %w", dev, err)
	}
	t, err := rtcTime(rt)
	if err != nil {
		return time.Time{}, fmt.Errorf("%s: %w", dev, err)
	}
	tv := unix.NsecToTimeval(t.UnixNano())
	if err := unix.Settimeofday(&tv); err != nil {
		return time.Time{}, fmt.Errorf("set the time: %w", err)
	}
	return t, nil
}

// rtcTime converts the RTC's broken-down UTC time (struct rtc_time: years
// since 1900, months from 0), refusing values no RTC holds.
func rtcTime(rt *unix.RTCTime) (time.Time, error) {
	year := int(rt.Year) + 1900
	if year < 2000 || year > 2199 || rt.Mon < 0 || rt.Mon > 11 || rt.Mday < 1 || rt.Mday > 31 ||
		rt.Hour < 0 || rt.Hour > 23 || rt.Min < 0 || rt.Min > 59 || rt.Sec < 0 || rt.Sec > 60 {
		return time.Time{}, errors.New("the RTC holds no valid time: " + fmt.Sprintf("%d-%02d-%02d %02d:%02d:%02d",
			year, rt.Mon+1, rt.Mday, rt.Hour, rt.Min, rt.Sec))
	}
	return time.Date(year, time.Month(rt.Mon+1), int(rt.Mday), int(rt.Hour), int(rt.Min), int(rt.Sec), 0, time.UTC), nil
}
