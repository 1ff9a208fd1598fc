package redistest

import (
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

// BenchVsPing is the loop of a benchmark that measures an operation against
// a PING round trip to s in the same run: each iteration times one ping and
// one op, alternately. It reports the p50 and p99 of both in microseconds
// (as "ping-p50-µs" and "<name>-p50-µs", and so on), their ratios, and the
// server's own microseconds per call of serverCmd (from INFO
// commandstats, reset first).
func BenchVsPing(b *testing.B, s *Server, name, serverCmd string, ping, op func() error) {
	b.Helper()
	if _, err := s.Do("CONFIG", "RESETSTAT"); err != nil {
		b.Fatal(err)
	}
	var pings, ops []time.Duration
	for b.Loop() {
		t0 := time.Now()
		if err := ping(); err != nil {
			b.Fatal(err)
		}
		t1 := time.Now()
		if err := op(); err != nil {
			b.Fatal(err)
		}
		pings = append(pings, t1.Sub(t0))
		ops = append(ops, time.Since(t1))
	}
	pp50, pp99 := Percentile(pings, 50), Percentile(pings, 99)
	op50, op99 := Percentile(ops, 50), Percentile(ops, 99)
	b.ReportMetric(Micros(pp50), "ping-p50-µs")
	b.ReportMetric(Micros(pp99), "ping-p99-µs")
	b.ReportMetric(Micros(op50), name+"-p50-µs")
	b.ReportMetric(Micros(op99), name+"-p99-µs")
	b.ReportMetric(float64(op50)/float64(pp50), "p50-ratio")
	b.ReportMetric(float64(op99)/float64(pp99), "p99-ratio")
	if us, ok := s.MicrosPerCall(serverCmd); ok {
		b.ReportMetric(us, "script-server-µs")
	}
}

// MicrosPerCall returns the server's usec_per_call for cmd from INFO
// commandstats.
func (s *Server) MicrosPerCall(cmd string) (float64, bool) {
	info, err := s.Do("INFO", "commandstats")
	if err != nil {
		return 0, false
	}
	for _, line := range strings.Split(info, "\n") {
		if rest, ok := strings.CutPrefix(strings.TrimSpace(line), "cmdstat_"+cmd+":"); ok {
			for _, field := range strings.Split(rest, ",") {
				if v, ok := strings.CutPrefix(field, "usec_per_call="); ok {
					f, err := strconv.ParseFloat(v, 64)
					return f, err == nil
				}
			}
		}
	}
	return 0, false
}

// Percentile returns the q-th percentile of ds (nearest rank), sorting ds.
func Percentile(ds []time.Duration, q int) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	slices.Sort(ds)
	i := (len(ds)*q + 99) / 100
	return ds[max(i-1, 0)]
}

// Micros converts d to microseconds.
func Micros(d time.Duration) float64 { return float64(d) / float64(time.Microsecond) }
