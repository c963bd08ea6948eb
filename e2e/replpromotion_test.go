package e2e

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// Promotion time with the election by longest log (replication.elect_longest_log) on and
// off, in one run: three flowd processes in sync mode and a sender sending synchronously,
// the master killed (kill -9) and restarted; each round logs the time from the kill to the
// first send acknowledged by the new master, and the test logs each setting's median (a
// measurement, not an assertion). FLOWD_PROMOTION_ROUNDS=N runs N rounds of each (default
// 1); FLOWD_LEASE_TRACE=1 has the members log each step of their lease.
func TestReplicaSetPromotionTimeWithAndWithoutElectionByLongestLog(t *testing.T) {
	rounds := 1
	if v := os.Getenv("FLOWD_PROMOTION_ROUNDS"); v != "" {
		n, err := strconv.Atoi(v)
		require.NoError(t, err)
		rounds = n
	}
	took := map[bool][]time.Duration{}
	for _, elect := range []bool{true, false} {
		t.Run(fmt.Sprintf("elect_longest_log=%v", elect), func(t *testing.T) {
			nodes := startReplicaSet(t, "sync", "--replication-elect-longest-log="+strconv.FormatBool(elect))
			s := startSender(t, nodes)
			defer s.halt()
			require.Eventually(t, func() bool { return s.count() > 50 }, wait, tick, "sends acknowledged")
			for r := range rounds {
				for _, n := range nodes {
					n.refresh()
				}
				allInSync(t, nodes)
				old := masterAddr(nodes)
				m := nodeAt(nodes, old)
				require.NotNil(t, m, "the routes name a live master")
				before := s.count()
				t0 := time.Now()
				m.kill()
				at := s.ackedBy(t, old, t0, nodes)
				took[elect] = append(took[elect], at.Sub(t0))
				t.Logf("round %d: kill -9 of rs-%d; a send acknowledged by the new master %s later", r+1, m.id, at.Sub(t0).Round(time.Millisecond))
				if os.Getenv("FLOWD_LEASE_TRACE") == "1" {
					logTrace(t, nodes, m, t0, at)
				}
				m.restart(t)
				require.Eventually(t, func() bool { return s.count() > before+20 }, wait, tick, "sends acknowledged after the fault")
			}
			s.halt()
			cur := masterAddr(nodes)
			require.NotEmpty(t, cur)
			s.checkAcked(t, cur)
			oneMasterPerEpoch(t, nodes)
		})
	}
	on, off := took[true], took[false]
	if len(on) > 0 && len(off) > 0 {
		t.Logf("promotion after kill -9, %d rounds each: elect_longest_log on: median %s (min %s, max %s); off: median %s (min %s, max %s); on/off %.2f",
			len(on), median(on), minDur(on), maxDur(on), median(off), minDur(off), maxDur(off), float64(median(on))/float64(median(off)))
	}
}

// logTrace logs the lease's steps (FLOWD_LEASE_TRACE=1) and the lease and stream lines of
// the members other than the killed one between the kill and the first acknowledged send,
// each with its time since the kill.
func logTrace(t *testing.T, nodes []*replNode, killed *replNode, t0, until time.Time) {
	t.Helper()
	for _, n := range nodes {
		if n == killed {
			continue
		}
		for _, l := range logLine.FindAllStringSubmatch(n.logs.String(), -1) {
			at, err := time.Parse(time.RFC3339Nano, l[1])
			if err != nil || at.Before(t0) || at.After(until) {
				continue
			}
			if strings.Contains(l[2], "lease trace: read") && !strings.Contains(l[2], "err=<nil>") ||
				!strings.Contains(l[2], "lease trace: read") && (strings.Contains(l[2], "lease") || strings.Contains(l[2], "master") || strings.Contains(l[2], "in-sync")) {
				t.Logf("  rs-%d +%s %s", n.id, at.Sub(t0).Round(time.Millisecond), l[2])
			}
		}
	}
}
