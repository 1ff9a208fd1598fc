package main

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"text/tabwriter"
	"time"
)

// The held phase: -held-streams streams open at once through each target,
// each lasting -held-dur with an event every -held-gap (the fake
// upstream's slow drip, each delta stamped with the time it was written),
// opened over -held-ramp. It records each event's trip from the
// upstream's write to the load generator's read, what each proxy adds to
// it over the same streams sent direct, the proxy's CPU per 1,000 events
// (in a window of each round with nothing but the streams' events) and
// its peak memory per held stream over its idle memory (measured once,
// fresh, before the first round); and beside the held streams, short calls
// at -held-rate, against as many of the same calls with no stream held,
// sent just before.

// heldStats is one target's held rounds.
type heldStats struct {
	lats             []int32 // every stamped event's trip, in microseconds
	events, expected int
	streams, done    int
	firstErr         error
	cpu              time.Duration // over the whole rounds: the streams' calls and the short calls too
	quietCPU         time.Duration // over the windows with nothing but the streams' events
	quietEvents      int           // the events due in those windows
	peaks            []int64       // the peak RSS of each round, in bytes
	short, quiet     []result
	shortDur         time.Duration
	quietDur         time.Duration
	busy             []float64
}

func (b *bench) held() error {
	o := b.o
	events := int(o.heldDur / o.heldGap)
	streamExtra := fmt.Sprintf("X-Bench-Stamp: 1\r\nX-Bench-Events: %d\r\nX-Bench-Gap-Us: %d\r\n", events, o.heldGap.Microseconds())
	shortExtra := "X-Bench-Delay-Ms: 0\r\n"
	idle := map[string]int64{}
	stats := map[string]*heldStats{}
	for _, name := range b.names {
		stats[name] = &heldStats{}
		// Warm up: connections, caches, the code's pages.
		t := newTarget(name, b.addrs[name], plainBody, shortExtra)
		t.run(200, time.Second)
		t.pool.closeIdle()
		s := newTarget(name, b.addrs[name], streamBody, fmt.Sprintf("X-Bench-Stamp: 1\r\nX-Bench-Events: 5\r\nX-Bench-Gap-Us: %d\r\n", o.heldGap.Microseconds()))
		var wg sync.WaitGroup
		for range 20 {
			wg.Add(1)
			go func() { defer wg.Done(); s.hold(time.Now().Add(time.Minute), nil) }()
		}
		wg.Wait()
	}
	time.Sleep(2 * time.Second)
	for _, name := range b.names {
		if p := b.procs[name]; p != nil {
			idle[name] = p.rss()
		}
	}
	fmt.Printf("\nHeld streams: %d at once, each %v with an event every %v (%d events), opened over %v; short calls at %.0f/s beside them; %d rounds of each, interleaved; load average %s\n",
		o.heldStreams, o.heldDur, o.heldGap, events, o.heldRamp, o.heldRate, o.heldRounds, loadAverage())
	for r := 0; r < o.heldRounds; r++ {
		for _, name := range b.rotated(r) {
			if err := b.heldRound(name, stats[name], events, streamExtra, shortExtra, r); err != nil {
				return err
			}
			time.Sleep(2 * time.Second)
		}
	}
	b.heldReport(stats, idle, events)
	return nil
}

// heldRound runs one round of the held phase against target name.
func (b *bench) heldRound(name string, st *heldStats, events int, streamExtra, shortExtra string, round int) error {
	o := b.o
	p := b.procs[name]
	// The windows of a round, once every stream is open: first one with
	// nothing but the streams' events, where the proxy's CPU per event is
	// measured (and the gateway profiled), then short calls beside the held
	// streams, to a second before the first stream ends. The same short
	// calls, as many, go first with no stream held.
	window := (o.heldDur - o.heldRamp - 2*time.Second) / 2
	if window <= 0 {
		return fmt.Errorf("-held-dur %v leaves no time after -held-ramp %v", o.heldDur, o.heldRamp)
	}
	quiet := newTarget(name, b.addrs[name], plainBody, shortExtra)
	st.quiet = append(st.quiet, quiet.run(o.heldRate, window)...)
	st.quietDur += window
	quiet.pool.closeIdle()

	var before usage
	if p != nil {
		p.resetPeak()
		before = p.usage()
	}
	busy0, total0 := machineCPU()
	streams := newTarget(name, b.addrs[name], streamBody, streamExtra)
	results := make([]held, o.heldStreams)
	var wg sync.WaitGroup
	start := time.Now()
	for i := range results {
		due := start.Add(time.Duration(int64(o.heldRamp) * int64(i) / int64(o.heldStreams)))
		time.Sleep(time.Until(due))
		wg.Add(1)
		go func() {
			defer wg.Done()
			results[i] = streams.hold(due.Add(o.heldDur+30*time.Second), make([]int32, 0, events))
		}()
	}
	time.Sleep(time.Until(start.Add(o.heldRamp + time.Second)))
	var quiet0 usage
	if p != nil {
		quiet0 = p.usage()
		if p.pprof != "" {
			secs := max(1, int(window/time.Second)-2)
			for _, prof := range []struct{ name, file string }{{fmt.Sprintf("profile?seconds=%d", secs), "cpu"}, {"heap?gc=1", "heap"},
				{"goroutine", "goroutine"}, {"goroutine?debug=1", "goroutine.txt"}, {"heap?debug=1", "heap.txt"}} {
				f := filepath.Join(o.pprof, fmt.Sprintf("%s-round%d.%s", name, round, prof.file))
				if err := fetchProfile(p.pprof, prof.name, f); err != nil {
					fmt.Printf("%s: profile %s: %v\n", name, prof.name, err)
				}
			}
		}
	}
	time.Sleep(time.Until(start.Add(o.heldRamp + time.Second + window)))
	if p != nil {
		st.quietCPU += p.usage().cpu - quiet0.cpu
		st.quietEvents += int(int64(o.heldStreams) * int64(window) / int64(o.heldGap))
	}
	short := newTarget(name, b.addrs[name], plainBody, shortExtra)
	st.short = append(st.short, short.run(o.heldRate, window)...)
	st.shortDur += window
	short.pool.closeIdle()
	wg.Wait()
	if p != nil {
		after := p.usage()
		st.cpu += after.cpu - before.cpu
		st.peaks = append(st.peaks, after.peakRSS)
	}
	busy1, total1 := machineCPU()
	if total1 > total0 {
		st.busy = append(st.busy, (busy1-busy0)/(total1-total0))
	}
	for _, h := range results {
		st.streams++
		st.expected += events
		st.events += len(h.lats)
		st.lats = append(st.lats, h.lats...)
		if h.done && h.err == nil {
			st.done++
		} else if st.firstErr == nil {
			st.firstErr = h.err
		}
	}
	return nil
}

// quantile32 is the q-quantile of xs (sorted), 0 for none.
func quantile32(xs []int32, q float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	return float64(xs[int(q*float64(len(xs)-1)+0.5)])
}

// heldReport prints the held phase's tables.
func (b *bench) heldReport(stats map[string]*heldStats, idle map[string]int64, events int) {
	o := b.o
	for _, st := range stats {
		slices.Sort(st.lats)
	}
	direct := stats["direct"]
	d50, d99 := quantile32(direct.lats, 0.5)/1e3, quantile32(direct.lats, 0.99)/1e3
	tw := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "target\tstreams\tcomplete\tevents\tmissing\tevent p50 ms\tp99 ms\tadded p50\tadded p99\tCPU s/1k events\tidle RSS MiB\tpeak RSS MiB\tKiB/stream\tround KiB/stream\tmachine busy\t")
	perStream := map[string]float64{}
	cpuPer := map[string]float64{}
	for _, name := range b.names {
		st := stats[name]
		p50, p99 := quantile32(st.lats, 0.5)/1e3, quantile32(st.lats, 0.99)/1e3
		a50, a99, cpu, idleMiB, peakMiB, kib := "", "", "", "", "", ""
		var rounds []string
		if name != "direct" {
			a50, a99 = fmt.Sprintf("%+.2f", p50-d50), fmt.Sprintf("%+.2f", p99-d99)
			cpuPer[name] = st.quietCPU.Seconds() / float64(max(st.quietEvents, 1)) * 1000
			cpu = fmt.Sprintf("%.4f", cpuPer[name])
			idleMiB = fmt.Sprintf("%.1f", float64(idle[name])/(1<<20))
			var per []float64
			for _, peak := range st.peaks {
				k := float64(peak-idle[name]) / 1024 / float64(o.heldStreams)
				per = append(per, k)
				rounds = append(rounds, fmt.Sprintf("%.1f", k))
			}
			slices.Sort(per)
			perStream[name] = per[len(per)/2] // the median round (the higher of two)
			peakMiB = fmt.Sprintf("%.1f", float64(slices.Max(st.peaks))/(1<<20))
			kib = fmt.Sprintf("%.1f", perStream[name])
		}
		fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%d\t%.2f\t%.2f\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%.0f%%\t\n", name, st.streams, st.done, st.events, st.expected-st.events,
			p50, p99, a50, a99, cpu, idleMiB, peakMiB, kib, strings.Join(rounds, " "), 100*mean(st.busy))
	}
	tw.Flush()
	for _, name := range b.names {
		if err := stats[name].firstErr; err != nil {
			fmt.Printf("%s: first stream error: %v\n", name, err)
		}
	}

	fmt.Printf("\nShort calls at %.0f/s: with no stream held, and beside the %d held streams\n", o.heldRate, o.heldStreams)
	tw = tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "target\tcalls\tnot ok\tp50 ms\tp99 ms\tadded p99\theld: calls\tnot ok\tp50 ms\tp99 ms\tadded p99\tp99 held/none\tadded p99 held/none\t")
	dq, ds := summarise(direct.quiet, direct.quietDur), summarise(direct.short, direct.shortDur)
	for _, name := range b.names {
		st := stats[name]
		q, s := summarise(st.quiet, st.quietDur), summarise(st.short, st.shortDur)
		aq, as, raw, ratio := "", "", "", ""
		if q.p99 < 1<<62 && s.p99 < 1<<62 {
			raw = fmt.Sprintf("%.2f", float64(s.p99)/float64(q.p99))
		}
		if name != "direct" {
			aq, as = added(q.p99, dq.p99), added(s.p99, ds.p99)
			// Only where both are above the direct calls': a difference of
			// two noisy quantiles near zero makes no ratio.
			if q.p99 < 1<<62 && s.p99 < 1<<62 && q.p99 > dq.p99 && s.p99 > ds.p99 {
				ratio = fmt.Sprintf("%.2f", float64(s.p99-ds.p99)/float64(q.p99-dq.p99))
			}
		}
		fmt.Fprintf(tw, "%s\t%d\t%d\t%s\t%s\t%s\t%d\t%d\t%s\t%s\t%s\t%s\t%s\t\n", name, q.calls, q.calls-q.ok, ms(q.p50), ms(q.p99), aq,
			s.calls, s.calls-s.ok, ms(s.p50), ms(s.p99), as, raw, ratio)
	}
	tw.Flush()
	for _, other := range []string{"nginx", "goproxy", "baseline"} {
		if _, ok := b.procs[other]; !ok {
			continue
		}
		g, n := stats["gateway"], stats[other]
		ga99 := quantile32(g.lats, 0.99)/1e3 - d99
		na99 := quantile32(n.lats, 0.99)/1e3 - d99
		fmt.Printf("held: gateway/%s memory per stream %.2fx, CPU per event %.2fx, added event p99 %.2fx\n", other,
			perStream["gateway"]/perStream[other], cpuPer["gateway"]/cpuPer[other], ga99/na99)
	}
}
