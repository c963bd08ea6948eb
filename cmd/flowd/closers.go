package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"time"
)

// closers is the stack of the daemon's parts in the order they were built: each part is
// pushed as soon as it exists, and close stops them in reverse, so that a part stops
// before the parts it was built on and a start that fails halfway stops exactly what it
// built. Adding a part to the daemon is one push where it is built.
type closers struct {
	log   *slog.Logger
	parts []part
}

// part is one thing the daemon stops, by name (in logs and errors).
type part struct {
	name string
	stop func(context.Context) error
}

// push adds a part, to stop before every part pushed earlier.
func (c *closers) push(name string, stop func(context.Context) error) {
	c.parts = append(c.parts, part{name: name, stop: stop})
}

// stopAfter adds a part that is built after the part named after but must stop right after
// it rather than before: the event publisher subscribes to the broker, yet has to outlive
// it to publish the broker's last events. The part named after must have been pushed.
func (c *closers) stopAfter(after, name string, stop func(context.Context) error) {
	i := slices.IndexFunc(c.parts, func(p part) bool { return p.name == after })
	if i < 0 {
		panic(fmt.Sprintf("closers: %q stops after %q, which was not pushed", name, after))
	}
	c.parts = slices.Insert(c.parts, i, part{name: name, stop: stop})
}

// close stops every part, the last pushed first, all within ctx (a part may narrow it),
// and empties the stack. A part that fails is logged with its name and does not keep the
// others from stopping; the errors are returned joined, each naming its part.
func (c *closers) close(ctx context.Context) error {
	var errs []error
	for i := len(c.parts) - 1; i >= 0; i-- {
		p := c.parts[i]
		began := time.Now()
		if err := p.stop(ctx); err != nil {
			c.log.Error("stop failed", "part", p.name, "err", err)
			errs = append(errs, fmt.Errorf("stop %s: %w", p.name, err))
			continue
		}
		c.log.Debug("stopped", "part", p.name, "took", time.Since(began).Round(time.Microsecond))
	}
	c.parts = nil
	return errors.Join(errs...)
}

// noErr adapts a stop function that cannot fail and needs no context.
func noErr(stop func()) func(context.Context) error {
	return func(context.Context) error {
		stop()
		return nil
	}
}

// noCtx adapts a stop function that takes no context.
func noCtx(stop func() error) func(context.Context) error {
	return func(context.Context) error { return stop() }
}
