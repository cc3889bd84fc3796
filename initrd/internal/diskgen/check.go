package diskgen

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/orrery-dev/orrery/internal/proto/joinpb"
	"github.com/orrery-dev/orrery/internal/records/admitted"
)

// JoinService calls join services that proved themselves control planes
// of the node's own cluster (a *joinconn.Dialer from OfCluster).
type JoinService interface {
	Call(ctx context.Context, addr string, call func(ctx context.Context, c joinpb.JoinServiceClient, opt grpc.CallOption) error) error
}

// Checker advances the state disk's generation with a join service, or
// stops the boot.
type Checker struct {
	// JoinService reaches the join services of the node's own cluster.
	// Required.
	JoinService JoinService
	// DiskUUID is the state disk's LUKS UUID.
	DiskUUID string
	// Path is File on the mounted state disk.
	Path string
	// First is the join service whose rejoin ticket opened the disk,
	// asked first in every round.
	First string
	// Others returns the other join services to ask when First does not
	// answer (every other control plane's); nil asks none.
	Others func(ctx context.Context) ([]string, error)
	// Say writes a line on the console.
	Say func(format string, args ...any)
	// Retry is the first pause between rounds; it doubles after each
	// round up to MaxRetry. Zero means 2 s and 15 s.
	Retry, MaxRetry time.Duration
}

// OlderDiskError means a join service refused the disk: it is an older
// copy of itself. Nothing was written to it; the node must not boot on.
type OlderDiskError struct {
	Addr string
	// Reason is the join service's word: what it saw, and what the
	// owner does about it.
	Reason string
}

func (e *OlderDiskError) Error() string {
	return fmt.Sprintf("the join service at %s refused this state disk: %s", e.Addr, e.Reason)
}

// errUnimplemented: the join service is older than the generation check.
var errUnimplemented = errors.New("the join service does not know the disk generation check (an older control plane)")

// fatalError is a failure of this node's own disk: asking elsewhere
// would not help.
type fatalError struct{ err error }

func (e *fatalError) Error() string { return e.err.Error() }
func (e *fatalError) Unwrap() error { return e.err }

// oldRounds is how many rounds in a row the join services that answered
// must all be older than the check, while others did not answer, before
// the node boots on unchecked.
const oldRounds = 3

// Run asks First, then the Others, round after round, until one of them
// recorded the disk's next generation (nil), refused the disk
// (*OlderDiskError), or ctx ends. It also ends, with nil and a warning on
// the console, once the join services that answer are all older than the
// check: at once if every one answered, after oldRounds rounds if some
// did not (a newer control plane may be coming up). An older join service
// keeps no generation to compare with. A disk whose generation cannot be
// read or written ends it with that error: the boot must not go on
// unchecked.
func (c *Checker) Run(ctx context.Context) error {
	pause, maxPause := c.Retry, c.MaxRetry
	if pause == 0 {
		pause = 2 * time.Second
	}
	if maxPause == 0 {
		maxPause = 15 * time.Second
	}
	last, old := "", 0
	for round := 1; ; round++ {
		err := c.round(ctx)
		if errors.Is(err, errUnimplemented) {
			old++
		} else {
			old = 0
		}
		var refused *OlderDiskError
		var fatal *fatalError
		switch {
		case err == nil:
			return nil
		case errors.Is(err, errUnimplemented) && (errors.Is(err, errAllAnswered) || old >= oldRounds):
			c.Say("WARNING: the control planes run a join service older than the disk generation check: this boot does not check that the state disk is its latest copy (it is checked again once the control planes are upgraded)")
			return nil
		case errors.As(err, &refused):
			return refused
		case errors.As(err, &fatal):
			return fatal.err
		case ctx.Err() != nil:
			return ctx.Err()
		}
		if why := err.Error(); why != last || round%10 == 0 {
			c.Say("the state disk's generation is not recorded yet (round %d, next in %s): %s", round, pause, why)
			last = why
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(pause):
		}
		pause = min(2*pause, maxPause)
	}
}

// errAllAnswered marks errUnimplemented from a round in which every
// join service answered.
var errAllAnswered = errors.New("every join service answered")

// round asks each join service once. It returns nil once one recorded the
// generation, an *OlderDiskError or fatalError at once, errUnimplemented
// (with errAllAnswered if no other failed) if every one that answered is
// older than the check, and the others' errors otherwise.
func (c *Checker) round(ctx context.Context) error {
	addrs := []string{c.First}
	var errs []error
	if c.Others != nil {
		others, err := c.Others(ctx)
		if err != nil {
			errs = append(errs, err)
		}
		for _, a := range others {
			if !slices.Contains(addrs, a) {
				addrs = append(addrs, a)
			}
		}
	}
	unimplemented := 0
	for _, addr := range addrs {
		err := c.ask(ctx, addr)
		var refused *OlderDiskError
		var fatal *fatalError
		switch {
		case err == nil, errors.As(err, &refused), errors.As(err, &fatal):
			return err
		case errors.Is(err, errUnimplemented):
			unimplemented++
		default:
			errs = append(errs, fmt.Errorf("%s: %w", addr, err))
		}
	}
	switch {
	case unimplemented > 0 && len(errs) == 0:
		return errors.Join(errUnimplemented, errAllAnswered)
	case unimplemented > 0:
		return errors.Join(append(errs, errUnimplemented)...)
	}
	return errors.Join(errs...)
}

// ask runs the check with the join service at addr, on one attested
// connection: present the disk's generation, write the next one the
// service answers, synced, and only then have the service record it.
// Nothing is written unless the service accepted the disk.
func (c *Checker) ask(ctx context.Context, addr string) error {
	return c.JoinService.Call(ctx, addr, func(ctx context.Context, js joinpb.JoinServiceClient, opt grpc.CallOption) error {
		have, err := Read(c.Path)
		if err != nil {
			return &fatalError{fmt.Errorf("%w: this boot cannot show that the state disk is its latest copy, so it goes no further; remove the node ('orrery node remove NAME --yes') and create a new one in its place", err)}
		}
		resp, err := js.CheckDiskGeneration(ctx, &joinpb.CheckDiskGenerationRequest{DiskUuid: c.DiskUUID, Generation: have}, opt)
		switch status.Code(err) {
		case codes.OK:
		case codes.Unimplemented:
			return errUnimplemented
		case codes.FailedPrecondition:
			return &OlderDiskError{Addr: addr, Reason: status.Convert(err).Message()}
		default:
			return fmt.Errorf("check the state disk's generation %d: %w", have, err)
		}
		next := resp.GetNextGeneration()
		if next <= have || next > admitted.MaxGeneration {
			return fmt.Errorf("the join service answered generation %d as the next after %d; not written", next, have)
		}
		if err := Write(c.Path, next); err != nil {
			return &fatalError{fmt.Errorf("%w: the boot goes no further without it", err)}
		}
		if _, err := js.RecordDiskGeneration(ctx, &joinpb.RecordDiskGenerationRequest{DiskUuid: c.DiskUUID, Generation: next}, opt); err != nil {
			// The disk holds next, which the next check accepts: a
			// retry presents it, and is given a later one.
			return fmt.Errorf("record the state disk's generation %d: %w", next, err)
		}
		c.Say("state disk generation %d recorded by the join service at %s (the disk held %d)", next, addr, have)
		return nil
	})
}
