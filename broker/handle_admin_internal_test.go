package broker

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
)

func TestConsumeRateIsCommitsPerSecondOverTheLastMinute(t *testing.T) {
	var r consumeRates
	t0 := time.Unix(1000, 0)
	assert.Zero(t, r.rate("g", 100, t0), "one sample has no rate")
	assert.InDelta(t, 10.0, r.rate("g", 200, t0.Add(10*time.Second)), 1e-9)
	assert.InDelta(t, 10.0, r.rate("g", 400, t0.Add(30*time.Second)), 1e-9, "measured from the oldest sample in the window")
	// 90 s: the samples at 0 s and 10 s are out of the window; the base is the 30 s one.
	assert.InDelta(t, 5.0, r.rate("g", 700, t0.Add(90*time.Second)), 1e-9)
	assert.Zero(t, r.rate("g", 0, t0.Add(95*time.Second)), "offsets moved back (a reset): no negative rate")
	assert.Zero(t, r.rate("other", 5, t0.Add(95*time.Second)), "groups are apart")
	// A group nobody asks about is forgotten.
	r.rate("other", 5, t0.Add(time.Hour))
	r.mu.Lock()
	_, kept := r.samples["g"]
	r.mu.Unlock()
	assert.False(t, kept)
}
