// Command gateway measures the bulkhead gateway side by side with nginx, a
// plain reverse proxy with the same limit of calls at once (limit_conn), in
// front of a fake OpenAI-compatible upstream on loopback. It is not a test:
// run it with scripts/bench-gateway.sh, which builds the gateway command
// from this repository and passes it here.
//
// It runs, in rounds that alternate the targets (straight to the upstream,
// through nginx, through the gateway):
//
//   - latency: calls at -rate per second, plain and streamed, against an
//     upstream that answers at once; it prints p50 and p99 from each call's
//     scheduled start, what each proxy adds over the direct call, CPU
//     seconds per 1,000 calls (from /proc/<pid>/stat) and peak RSS;
//   - shed cost: the same rate while -limit calls hold every slot, so that
//     every call is turned away, against the served calls' cost (the
//     bare Go proxy of -goproxy answers these calls 503 itself: the floor
//     of a call a Go server turns away);
//   - overload: rising rates against an upstream that takes -overload-delay
//     per call, up to the rate where the p99 of all calls first exceeds
//     100 ms (a call that is not served counts as slower than any), then
//     twice and four times that rate; it prints goodput (calls served per
//     second) and the p99 of the served calls;
//   - held (not run by default): -held-streams streams held open at once,
//     each lasting -held-dur with an event every -held-gap (the fake
//     upstream's slow drip, each event stamped with the time it was
//     written), against fresh processes with room for them: each event's
//     trip and what each proxy adds to it over the same streams sent
//     direct, the proxy's CPU per 1,000 events (in a window with nothing
//     but the events), its peak memory per held stream over its idle
//     memory, and short calls at -held-rate beside the held streams
//     against the same calls with no stream held. -pprof runs the gateway
//     in this benchmark's binary, with a profiling endpoint, and saves its
//     heap and goroutine profiles at the held load; -gateway-env sets
//     GOMEMLIMIT or GOGC for it.
//
// The machine is shared: compare the figures of one run, as ratios.
package main

import (
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"text/tabwriter"
	"time"
)

const (
	plainBody  = `{"model":"gpt-4o-mini","messages":[{"role":"system","content":"You are a helpful assistant."},{"role":"user","content":"Say hello in one short sentence."}],"max_tokens":64}`
	streamBody = `{"model":"gpt-4o-mini","stream":true,"messages":[{"role":"system","content":"You are a helpful assistant."},{"role":"user","content":"Say hello in one short sentence."}],"max_tokens":64}`
)

// options are the command's flags.
type options struct {
	gateway, nginx     string
	baseline           string
	rate               float64
	rounds             int
	dur                time.Duration
	limit, queue       int
	logMode            string
	events             int
	overloadDelay      time.Duration
	sweepStart, factor float64
	sweepMax           float64
	knee               float64
	phases             map[string]bool
	perf               string
	modes              []string
	keep, goproxy      bool

	heldStreams int           // streams held at once in the held phase
	heldDur     time.Duration // the length of one held stream
	heldGap     time.Duration // the time between two of its events
	heldRamp    time.Duration // the time over which the streams are opened
	heldRate    float64       // short calls per second beside the held streams
	heldRounds  int
	pprof       string   // a directory for the in-process gateway's profiles at the held load
	gatewayEnv  []string // KEY=VALUE pairs added to the gateway's environment (GOMEMLIMIT, GOGC)
}

func main() {
	if len(os.Args) > 3 && os.Args[1] == "gateway-inproc" {
		fmt.Fprintln(os.Stderr, serveGatewayInProcess(os.Args[2], os.Args[3]))
		os.Exit(1)
	}
	if len(os.Args) > 2 && (os.Args[1] == "upstream" || os.Args[1] == "goproxy") {
		ln, err := net.Listen("tcp", os.Args[2])
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		if os.Args[1] == "upstream" {
			err = serveUpstream(ln)
		} else {
			if len(os.Args) > 4 { // with a profiling endpoint
				servePprof(os.Args[4])
			}
			err = serveGoProxy(ln, os.Args[3])
		}
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	var o options
	flag.StringVar(&o.gateway, "gateway", "", "the bulkhead command to measure (required; scripts/bench-gateway.sh builds it)")
	flag.StringVar(&o.nginx, "nginx", nginxBinary(), "nginx; empty skips it")
	flag.StringVar(&o.baseline, "baseline", "", "another build of the bulkhead command, measured beside -gateway as target baseline (before and after a change)")
	flag.Float64Var(&o.rate, "rate", 500, "calls per second in the latency and shed rounds")
	flag.IntVar(&o.rounds, "rounds", 3, "rounds of each target in the latency and shed phases")
	flag.DurationVar(&o.dur, "dur", 5*time.Second, "the length of one round")
	flag.IntVar(&o.limit, "limit", 64, "calls at once, in the gateway's bulkhead and nginx's limit_conn")
	flag.IntVar(&o.queue, "queue", 0, "the gateway bulkhead's queue (nginx has none)")
	flag.StringVar(&o.logMode, "log", "all", "the gateway's request log (all, errors, none); nginx logs every request unless none")
	flag.IntVar(&o.events, "events", 10, "text deltas in a streamed answer")
	flag.DurationVar(&o.overloadDelay, "overload-delay", 50*time.Millisecond, "the upstream's time per call in the overload phase (streamed: spread over its events)")
	flag.Float64Var(&o.sweepStart, "sweep-start", 400, "the first rate of the overload sweep")
	flag.Float64Var(&o.factor, "sweep-factor", 1.25, "the ratio of two rates of the sweep")
	flag.Float64Var(&o.sweepMax, "sweep-max", 12000, "the highest rate of the sweep")
	flag.Float64Var(&o.knee, "knee", 0, "skip the sweep: run 1x, 2x and 4x this rate for every proxy")
	flag.IntVar(&o.heldStreams, "held-streams", 2000, "streams held open at once in the held phase")
	flag.DurationVar(&o.heldDur, "held-dur", 20*time.Second, "the length of one held stream")
	flag.DurationVar(&o.heldGap, "held-gap", 50*time.Millisecond, "the time between two events of a held stream")
	flag.DurationVar(&o.heldRamp, "held-ramp", 2*time.Second, "the time over which the held streams are opened")
	flag.Float64Var(&o.heldRate, "held-rate", 200, "short calls per second sent beside the held streams (and with none held, to compare)")
	flag.IntVar(&o.heldRounds, "held-rounds", 2, "rounds of each target in the held phase")
	flag.StringVar(&o.pprof, "pprof", "", "run the gateway in this benchmark's process (the same code, built from this checkout), and it and the bare Go proxy with a profiling endpoint; write the gateway's CPU, heap and goroutine profiles at the held load into this directory")
	gatewayEnv := flag.String("gateway-env", "", "environment variables for the gateway (not the baseline), such as GOMEMLIMIT=128MiB, separated by commas")
	phases := flag.String("phases", "latency,shed,overload", "the phases to run (latency, shed, overload, held)")
	flag.StringVar(&o.perf, "perf", "", "record the gateway with perf (perf record -g) into this file, over every phase")
	modes := flag.String("modes", "plain,streamed", "the kinds of call to measure")
	flag.BoolVar(&o.goproxy, "goproxy", false, "measure a bare httputil.ReverseProxy too (the floor of a Go proxy)")
	flag.BoolVar(&o.keep, "keep", false, "keep the working directory (configurations, logs)")
	flag.Parse()
	o.modes = strings.Split(*modes, ",")
	if *gatewayEnv != "" {
		o.gatewayEnv = strings.Split(*gatewayEnv, ",")
	}
	o.phases = map[string]bool{}
	for _, p := range strings.Split(*phases, ",") {
		o.phases[p] = true
	}
	if o.gateway == "" {
		fmt.Fprintln(os.Stderr, "gateway: -gateway is required (run scripts/bench-gateway.sh)")
		os.Exit(2)
	}
	if err := run(o); err != nil {
		fmt.Fprintln(os.Stderr, "gateway:", err)
		os.Exit(1)
	}
}

// bench is the processes of a run and the targets that reach them.
type bench struct {
	o        options
	dir      string
	upstream string
	procs    map[string]*proc // by target name; none for direct
	up       *proc            // the fake upstream
	addrs    map[string]string
	names    []string // the targets: direct, nginx (when there), goproxy and baseline (when asked), gateway
}

// add makes p, listening on addr, the target name, after those added
// before; run stops it on its way out.
func (b *bench) add(name string, p *proc, addr string) {
	b.procs[name], b.addrs[name] = p, addr
	b.names = append(b.names, name)
}

func run(o options) error {
	dir, err := os.MkdirTemp("", "bench-gateway-")
	if err != nil {
		return err
	}
	if o.keep {
		fmt.Printf("working directory: %s\n", dir)
	} else {
		defer os.RemoveAll(dir)
	}
	b := &bench{o: o, dir: dir}
	b.upstream = freePort()
	up, err := launch("upstream", dir, b.upstream, false, nil, os.Args[0], "upstream", b.upstream)
	if err != nil {
		return err
	}
	defer up.stop()
	b.up = up
	fmt.Printf("%d CPUs; load average %s at the start\n", runtime.NumCPU(), loadAverage())
	defer func() { fmt.Printf("\nload average %s at the end\n", loadAverage()) }()
	if o.phases["latency"] || o.phases["shed"] || o.phases["overload"] {
		if err := b.start(dir, o.limit); err != nil {
			b.stopAll()
			return err
		}
		fmt.Printf("limit %d calls at once (gateway queue %d); request log %s; rounds of %v\n", o.limit, o.queue, o.logMode, o.dur)
		stopPerf, err := b.perf(o.perf)
		if err != nil {
			b.stopAll()
			return err
		}
		served := map[string]float64{}
		if o.phases["latency"] {
			served = b.latency()
		}
		if o.phases["shed"] {
			b.shedCost(served)
		}
		if o.phases["overload"] {
			b.overload()
		}
		stopPerf()
		b.stopAll()
	}
	if o.phases["held"] {
		// Fresh processes, with room for the held streams and the short
		// calls beside them: their idle memory is the baseline.
		hdir := filepath.Join(dir, "held")
		if err := os.Mkdir(hdir, 0o700); err != nil {
			return err
		}
		hb := &bench{o: o, dir: hdir, upstream: b.upstream, up: b.up}
		defer hb.stopAll()
		if err := hb.start(hdir, o.heldStreams+heldMargin); err != nil {
			return err
		}
		perfFile := o.perf
		if perfFile != "" && b.procs != nil {
			perfFile += ".held"
		}
		stopPerf, err := hb.perf(perfFile)
		if err != nil {
			return err
		}
		defer stopPerf()
		if err := hb.held(); err != nil {
			return err
		}
	}
	return nil
}

// heldMargin is the room the held phase's proxies have beyond the held
// streams, for the short calls sent beside them.
const heldMargin = 1024

// start launches the proxies, with their files in dir, each letting limit
// calls through at once (nginx's limit_conn, the gateways' bulkhead).
func (b *bench) start(dir string, limit int) error {
	o := b.o
	b.procs, b.addrs = map[string]*proc{}, map[string]string{"direct": b.upstream}
	b.names = []string{"direct"}
	if o.nginx == "" {
		fmt.Println("nginx is not installed (apt-get install nginx): the nginx floor is skipped")
	} else {
		p, addr, err := startNginx(o.nginx, dir, b.upstream, limit, o.logMode != "none")
		if err != nil {
			return err
		}
		b.add("nginx", p, addr)
	}
	if o.goproxy {
		addr := freePort()
		args := []string{"goproxy", addr, b.upstream}
		pprof := ""
		if o.pprof != "" {
			pprof = freePort()
			args = append(args, pprof)
		}
		p, err := launch("goproxy", dir, addr, false, nil, os.Args[0], args...)
		if err != nil {
			return err
		}
		if p.pprof = pprof; pprof != "" {
			fmt.Printf("goproxy: profiling endpoint http://%s/debug/pprof/\n", pprof)
		}
		b.add("goproxy", p, addr)
	}
	for _, g := range []struct{ name, bin string }{{"baseline", o.baseline}, {"gateway", o.gateway}} {
		if g.bin == "" {
			continue // no -baseline
		}
		bin := g.bin
		if g.name == "gateway" && o.pprof != "" {
			bin = "" // in this process's binary, with a profiling endpoint (see serveGatewayInProcess)
		}
		var env []string
		if g.name == "gateway" {
			env = o.gatewayEnv
		}
		p, addr, err := startGateway(g.name, bin, dir, b.upstream, limit, o.queue, o.logMode, env)
		if err != nil {
			return err
		}
		b.add(g.name, p, addr)
	}
	return nil
}

// stopAll stops the proxies start launched.
func (b *bench) stopAll() {
	for _, p := range b.procs {
		p.stop()
	}
	b.procs = nil
}

// perf records the gateway with perf into file, until the returned func
// is called; nothing for an empty file.
func (b *bench) perf(file string) (stop func(), err error) {
	if file == "" {
		return func() {}, nil
	}
	perf := exec.Command("perf", "record", "-F", "499", "-g", "-o", file, "-p", strconv.Itoa(b.procs["gateway"].cmd.Process.Pid))
	perf.Stdout, perf.Stderr = io.Discard, io.Discard
	if err := perf.Start(); err != nil {
		return nil, fmt.Errorf("perf: %w", err)
	}
	return func() {
		_ = perf.Process.Signal(syscall.SIGINT)
		_ = perf.Wait()
	}, nil
}

// loadAverage is the machine's load average over 1, 5 and 15 minutes.
func loadAverage() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "unknown"
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "unknown"
	}
	return strings.Join(f[:3], " ")
}

// measured is the results of one target's rounds, with its processes'
// usage over them.
type measured struct {
	res     []result
	dur     time.Duration
	cpu     time.Duration
	peakRSS int64
	rounds  []stats
	cpus    []float64     // CPU seconds per 1,000 calls, by round
	harness time.Duration // the CPU time of the load generator and the upstream
	busy    []float64     // the share of the machine's CPU time in use, by round (every process)
}

func (m *measured) add(res []result, d time.Duration, before, after usage) {
	m.res = append(m.res, res...)
	m.dur += d
	m.cpu += after.cpu - before.cpu
	m.peakRSS = max(m.peakRSS, after.peakRSS)
	m.rounds = append(m.rounds, summarise(res, d))
	if len(res) > 0 {
		m.cpus = append(m.cpus, (after.cpu-before.cpu).Seconds()/float64(len(res))*1000)
	}
}

// round runs one round against a target and measures its processes.
func (b *bench) round(t *target, rate float64, m *measured) stats {
	p := b.procs[t.name]
	var before usage
	if p != nil {
		p.resetPeak()
		before = p.usage()
	}
	harness0 := cpuTime(os.Getpid()) + b.up.usage().cpu
	busy0, total0 := machineCPU()
	res := t.run(rate, b.o.dur)
	var after usage
	if p != nil {
		after = p.usage()
	}
	busy1, total1 := machineCPU()
	m.harness += cpuTime(os.Getpid()) + b.up.usage().cpu - harness0
	if total1 > total0 {
		m.busy = append(m.busy, (busy1-busy0)/(total1-total0))
	}
	m.add(res, b.o.dur, before, after)
	return m.rounds[len(m.rounds)-1]
}

// rotated returns the targets in the order of round r: each comes first
// in turn.
func (b *bench) rotated(r int) []string {
	n := len(b.names)
	out := make([]string, n)
	for i := range out {
		out[i] = b.names[(i+r)%n]
	}
	return out
}

// latency runs the latency phase, and returns the CPU seconds per 1,000
// calls of each proxy, by "mode/proxy".
func (b *bench) latency() map[string]float64 {
	o := b.o
	extra := fmt.Sprintf("X-Bench-Delay-Ms: 0\r\nX-Bench-Events: %d\r\n", o.events)
	results := map[string]map[string]*measured{}
	for _, mode := range o.modes {
		body := plainBody
		if mode == "streamed" {
			body = streamBody
		}
		targets := map[string]*target{}
		results[mode] = map[string]*measured{}
		for _, name := range b.names {
			targets[name] = newTarget(name, b.addrs[name], body, extra)
			results[mode][name] = &measured{}
			targets[name].run(o.rate, time.Second) // warm up: connections, caches
		}
		for r := 0; r < o.rounds; r++ {
			for _, name := range b.rotated(r) {
				b.round(targets[name], o.rate, results[mode][name])
				time.Sleep(200 * time.Millisecond)
			}
		}
		for _, t := range targets {
			t.pool.closeIdle()
			if t.firstErr != nil {
				fmt.Printf("%s, %s: first error: %v\n", mode, t.name, t.firstErr)
			}
		}
	}
	fmt.Printf("\nLatency at %.0f calls/s, upstream answering at once (streamed: %d deltas, each its own chunk); %d rounds of each, interleaved\n",
		o.rate, o.events, o.rounds)
	tw := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "mode\ttarget\tcalls\tshed/other/failed\tp50 ms\tp99 ms\tadded p50\tadded p99\tround p50s\tCPU s/1k calls\tround CPUs\tpeak RSS MiB\t")
	cpuPer := map[string]float64{}
	for _, mode := range o.modes {
		direct := summarise(results[mode]["direct"].res, results[mode]["direct"].dur)
		for _, name := range b.names {
			m := results[mode][name]
			s := summarise(m.res, m.dur)
			var rp, rc []string
			for _, rs := range m.rounds {
				rp = append(rp, ms(rs.p50))
			}
			added50, added99, cpu, rss := "", "", "", ""
			if name != "direct" {
				added50, added99 = added(s.p50, direct.p50), added(s.p99, direct.p99)
				per := m.cpu.Seconds() / float64(s.calls) * 1000
				cpuPer[mode+"/"+name] = per
				cpu = fmt.Sprintf("%.3f", per)
				rss = fmt.Sprintf("%.1f", float64(m.peakRSS)/(1<<20))
				for _, c := range m.cpus {
					rc = append(rc, fmt.Sprintf("%.3f", c))
				}
			}
			fmt.Fprintf(tw, "%s\t%s\t%d\t%d/%d/%d\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t\n", mode, name, s.calls, s.shed, s.other, s.failed, ms(s.p50), ms(s.p99),
				added50, added99, strings.Join(rp, " "), cpu, strings.Join(rc, " "), rss)
		}
	}
	tw.Flush()
	for _, other := range []string{"nginx", "goproxy", "baseline"} {
		if _, ok := b.procs[other]; !ok {
			continue
		}
		for _, mode := range o.modes {
			d := summarise(results[mode]["direct"].res, results[mode]["direct"].dur)
			g := summarise(results[mode]["gateway"].res, results[mode]["gateway"].dur)
			n := summarise(results[mode][other].res, results[mode][other].dur)
			fmt.Printf("%s: gateway/%s CPU per call %.2fx, added p50 %.2fx\n", mode, other,
				cpuPer[mode+"/gateway"]/cpuPer[mode+"/"+other], float64(g.p50-d.p50)/float64(n.p50-d.p50))
		}
	}
	return cpuPer
}

// shedCost measures what a call turned away costs: every slot is held by
// calls the upstream answers late, and calls arrive at the latency rate;
// served has the cost of a served call (from the latency phase), by
// "mode/proxy".
func (b *bench) shedCost(served map[string]float64) {
	o := b.o
	names := b.names[1:]
	// Every slot of every proxy is held for the whole phase.
	hold := time.Duration(o.rounds*len(names))*(o.dur+time.Second) + 5*time.Second
	var holding sync.WaitGroup
	targets, results := map[string]*target{}, map[string]*measured{}
	for _, name := range names {
		if name == "goproxy" { // no limit: it answers these calls itself (see shedHeader)
			targets[name], results[name] = newTarget(name, b.addrs[name], plainBody, shedHeader+": 1\r\n"), &measured{}
			continue
		}
		holder := newTarget(name, b.addrs[name], plainBody, fmt.Sprintf("X-Bench-Delay-Ms: %d\r\n", hold.Milliseconds()))
		holder.timeout = hold + 10*time.Second
		for range o.limit + o.queue {
			holding.Add(1)
			go func() { defer holding.Done(); holder.call(time.Now()) }()
		}
		targets[name], results[name] = newTarget(name, b.addrs[name], plainBody, "X-Bench-Delay-Ms: 0\r\n"), &measured{}
	}
	time.Sleep(500 * time.Millisecond) // every slot taken
	for r := 0; r < o.rounds; r++ {
		for i := range names {
			name := names[(i+r)%len(names)]
			b.round(targets[name], o.rate, results[name])
			time.Sleep(200 * time.Millisecond)
		}
	}
	fmt.Printf("\nShed calls at %.0f calls/s, every slot held; %d rounds of each, interleaved\n", o.rate, o.rounds)
	tw := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "target\tcalls\tshed\tp50 ms\tp99 ms\tCPU s/1k shed\tround CPUs\tserved plain s/1k\tratio\t")
	for _, name := range names {
		m := results[name]
		targets[name].pool.closeIdle()
		s := summarise(m.res, m.dur)
		per := m.cpu.Seconds() / float64(s.calls) * 1000
		var rc []string
		for _, c := range m.cpus {
			rc = append(rc, fmt.Sprintf("%.3f", c))
		}
		fmt.Fprintf(tw, "%s\t%d\t%d\t%s\t%s\t%.3f\t%s\t%.3f\t%.2f\t\n", name, s.calls, s.shed, ms(quantileOf(m.res, 0.5)), ms(quantileOf(m.res, 0.99)),
			per, strings.Join(rc, " "), served["plain/"+name], per/served["plain/"+name])
	}
	tw.Flush()
	fmt.Printf("(waiting %v for the held calls to end)\n", hold.Round(time.Second))
	holding.Wait()
}

// mean is the mean of xs, 0 for none.
func mean(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	sum := 0.0
	for _, x := range xs {
		sum += x
	}
	return sum / float64(len(xs))
}

// added is what a proxy's quantile adds to the direct call's.
func added(proxy, direct time.Duration) string {
	if proxy >= 1<<62 || direct >= 1<<62 {
		return "∞"
	}
	return fmt.Sprintf("%+.2f", float64(proxy-direct)/float64(time.Millisecond))
}

// quantileOf is the q-quantile of the latencies of every call that got an
// answer, whatever its status.
func quantileOf(res []result, q float64) time.Duration {
	var ds []time.Duration
	for _, r := range res {
		if r.out != failed {
			ds = append(ds, r.lat)
		}
	}
	return quantile(ds, q)
}

// overload sweeps rising rates for each proxy, plain and streamed, to the
// rate where its p99 first exceeds 100 ms, then runs twice and four times
// that rate.
func (b *bench) overload() {
	o := b.o
	proxies := b.names[1:]
	for _, mode := range o.modes {
		body, extra := plainBody, fmt.Sprintf("X-Bench-Delay-Ms: %d\r\n", o.overloadDelay.Milliseconds())
		if mode == "streamed" {
			body = streamBody
			extra = fmt.Sprintf("X-Bench-Events: %d\r\nX-Bench-Gap-Us: %d\r\n", o.events, o.overloadDelay.Microseconds()/int64(o.events))
		}
		fmt.Printf("\nOverload, %s: the upstream takes %v per call; limit %d; rounds of %v\n", mode, o.overloadDelay, o.limit, o.dur)
		tw := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', tabwriter.AlignRight)
		fmt.Fprintln(tw, "target\trate/s\tx\tserved/s\tshed\tfailed\tp99 ms (all)\tp99 ms (served)\tCPU s/1k calls\tpeak RSS MiB\tharness cores\tmachine busy\t")
		knee := map[string]float64{}
		peak := map[string]float64{}
		runAt := func(name string, rate float64, label string) stats {
			t := newTarget(name, b.addrs[name], body, extra)
			m := &measured{}
			s := b.round(t, rate, m)
			t.pool.closeIdle()
			peak[name] = max(peak[name], s.goodput)
			fmt.Fprintf(tw, "%s\t%.0f\t%s\t%.0f\t%d\t%d\t%s\t%s\t%.3f\t%.1f\t%.2f\t%.0f%%\t\n", name, rate, label, s.goodput, s.shed, s.failed+s.other,
				ms(s.p99), ms(s.okP99), m.cpu.Seconds()/float64(s.calls)*1000, float64(m.peakRSS)/(1<<20),
				m.harness.Seconds()/m.dur.Seconds(), 100*mean(m.busy))
			time.Sleep(time.Second) // the answers of the round drain
			return s
		}
		if o.knee > 0 { // no sweep: the same rates for every proxy
			for _, name := range proxies {
				knee[name] = o.knee
			}
		}
		for rate := o.sweepStart; rate <= o.sweepMax && len(knee) < len(proxies); rate *= o.factor {
			for _, name := range proxies {
				if knee[name] > 0 {
					continue
				}
				if s := runAt(name, rate, ""); s.p99 > 100*time.Millisecond {
					knee[name] = rate
				}
			}
		}
		at := map[string][]stats{}
		for _, x := range []float64{1, 2, 4} {
			for _, name := range proxies {
				if knee[name] > 0 {
					at[name] = append(at[name], runAt(name, knee[name]*x, fmt.Sprintf("%.0fx", x)))
				}
			}
		}
		tw.Flush()
		for _, name := range proxies {
			if knee[name] == 0 {
				fmt.Printf("%s: p99 stayed under 100 ms up to %.0f calls/s\n", name, o.sweepMax)
				continue
			}
			a := at[name]
			fmt.Printf("%s: p99 first over 100 ms at %.0f calls/s; peak goodput %.0f/s; goodput at 1x/2x/4x %.0f%%/%.0f%%/%.0f%% of it; p99 served at 2x %s ms\n",
				name, knee[name], peak[name], 100*a[0].goodput/peak[name], 100*a[1].goodput/peak[name], 100*a[2].goodput/peak[name], ms(a[1].okP99))
		}
	}
}
