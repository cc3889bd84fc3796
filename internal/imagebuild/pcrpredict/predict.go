// Package pcrpredict computes the PCR values a node's boot chain produces from
// the artefacts of its image, event by event, in the SHA-256 bank:
//
//   - PCR 4: OVMF's boot of the UKI from a boot option: the EV_EFI_ACTION
//     "Calling EFI Application from Boot Option", the EV_SEPARATOR that ends
//     the pre-boot phase, the Authenticode hash of the UKI
//     (EV_EFI_BOOT_SERVICES_APPLICATION), and then the Authenticode hash of
//     the kernel, which systemd-stub 252 starts with LoadImage, so that the
//     firmware measures it too;
//   - PCR 5: OVMF's EV_SEPARATOR, the boot disk's GPT (EV_EFI_GPT_EVENT)
//     and the two EV_EFI_ACTIONs around ExitBootServices (see PCR5);
//   - PCR 9: what Linux 6.1's EFI stub measures (EV_EVENT_TAG): first its
//     LoadOptions, the command line systemd-stub hands it as a
//     NUL-terminated UTF-16 string, then the initrd it loads through the
//     LoadFile2 protocol;
//   - PCR 11: systemd-stub 252's measurements of the UKI's sections (each
//     section's name with its terminating NUL, then its contents, in the
//     stub's fixed order), then the initrd's phase markers.
//
// A PCR starts at zero; extending it with digest d makes it
// SHA-256(PCR || d).
package pcrpredict

import (
	"crypto/sha256"
	"fmt"
	"slices"

	"github.com/orrery-dev/orrery/internal/imagebuild/uki"
)

// Event is one extend of a PCR.
type Event struct {
	PCR    uint32
	Digest []byte
	// Description says what was measured, for people.
	Description string
}

func (e Event) String() string {
	return fmt.Sprintf("PCR %d %x %s", e.PCR, e.Digest, e.Description)
}

// Firmware strings and data that OVMF measures into PCR 4 (EDK2's
// Tcg2Dxe, see the TCG PC Client Platform Firmware Profile).
const (
	// CallingEFIApplication is the EV_EFI_ACTION measured at the first
	// boot attempt (ReadyToBoot).
	CallingEFIApplication = "Calling EFI Application from Boot Option"
)

// separatorData is the event data of an EV_SEPARATOR: a 32-bit zero.
var separatorData = []byte{0, 0, 0, 0}

// Markers of the initrd's phases in PCR 11 (see initrd/).
const (
	EnterInitrd = "enter-initrd"
	LeaveInitrd = "leave-initrd"
)

// Measure returns the event that extends pcr with SHA-256(data).
func Measure(pcr uint32, data []byte, description string) Event {
	d := sha256.Sum256(data)
	return Event{PCR: pcr, Digest: d[:], Description: description}
}

// BootApplication returns the PCR 4 events of OVMF starting, from the first
// boot option it tries, the EFI application whose Authenticode SHA-256
// digest is appHash.
func BootApplication(appHash []byte, name string) []Event {
	return []Event{
		Measure(4, []byte(CallingEFIApplication), "EV_EFI_ACTION "+CallingEFIApplication),
		Measure(4, separatorData, "EV_SEPARATOR"),
		{PCR: 4, Digest: slices.Clone(appHash), Description: "EV_EFI_BOOT_SERVICES_APPLICATION " + name},
	}
}

// Kernel returns the PCR 4 event of systemd-stub starting the kernel (the
// UKI's .linux section) with LoadImage; kernelHash is its Authenticode
// SHA-256 digest.
func Kernel(kernelHash []byte) Event {
	return Event{PCR: 4, Digest: slices.Clone(kernelHash), Description: "EV_EFI_BOOT_SERVICES_APPLICATION .linux (LoadImage by systemd-stub)"}
}

// LoadOptions returns the PCR 9 event of Linux's EFI stub measuring its
// command line, given as the UKI's .cmdline section (ASCII): the stub
// hands it to the kernel as UTF-16 with a terminating NUL.
func LoadOptions(cmdline []byte) (Event, error) {
	u := make([]byte, 0, 2*len(cmdline)+2)
	for _, c := range cmdline {
		if c < 0x20 || c > 0x7e {
			return Event{}, fmt.Errorf("command line has byte %#x: only printable ASCII is measured predictably", c)
		}
		u = append(u, c, 0)
	}
	u = append(u, 0, 0)
	return Measure(9, u, "EV_EVENT_TAG LOADED_IMAGE::LoadOptions"), nil
}

// Initrd returns the PCR 9 event of Linux's EFI stub loading initrd (the
// whole initrd systemd-stub hands over: here its .initrd section).
func Initrd(initrd []byte) Event {
	return Measure(9, initrd, "EV_EVENT_TAG Linux initrd")
}

// UKISections returns the PCR 11 events of systemd-stub 252 measuring the
// sections of a UKI, given by name with the bytes the stub measures (see
// uki.Sections). Sections the stub does not measure are ignored.
func UKISections(sections map[string][]byte) []Event {
	var events []Event
	for _, name := range uki.MeasuredSections {
		data, ok := sections[name]
		if !ok || len(data) == 0 {
			continue
		}
		events = append(events,
			Measure(11, append([]byte(name), 0), "EV_IPL section name "+name),
			Measure(11, data, "EV_IPL section "+name),
		)
	}
	return events
}

// Markers returns the PCR 11 events of the given phase markers.
func Markers(markers ...string) []Event {
	var events []Event
	for _, m := range markers {
		events = append(events, Measure(11, []byte(m), "phase "+m))
	}
	return events
}

// Replay computes the PCR values the events produce, starting from zero.
// PCRs without events are not in the result.
func Replay(events []Event) map[uint32][]byte {
	pcrs := map[uint32][]byte{}
	for _, e := range events {
		cur, ok := pcrs[e.PCR]
		if !ok {
			cur = make([]byte, sha256.Size)
		}
		pcrs[e.PCR] = Extend(cur, e.Digest)
	}
	return pcrs
}

// Extend returns SHA-256(pcr || digest).
func Extend(pcr, digest []byte) []byte {
	h := sha256.New()
	h.Write(pcr)
	h.Write(digest)
	return h.Sum(nil)
}
