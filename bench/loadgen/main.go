// Command loadgen drives an HTTPS endpoint with POST requests, closed loop (saturation) or open
// loop (a fixed arrival rate), and prints one JSON object with the figures.
//
// It is a small, allocation-light client so that on a 2-core machine the server, not the client,
// is the bottleneck: one keep-alive HTTP/1.1 connection per worker, the body sent from memory,
// the answer read and discarded, latencies kept in an HDR-style log-linear histogram.
//
// Closed loop (-rate 0): -connections workers each send the next request as soon as the last one
// is answered; the achieved rate is the saturation throughput.
//
// Open loop (-rate R): requests are due at fixed instants (start + i/R), whether or not earlier
// ones have been answered. A request waits for a free connection from a pool of -connections;
// its latency counts from its due instant, so a server that falls behind shows the queueing
// (no coordinated omission). Requests still unsent when the run ends count as "late".
package main

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"math/bits"
	"net/http"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
)

// histogram: 1 µs resolution below 1 ms, then ~1 % relative error up to 100 s.
type histogram struct {
	counts []uint64
	max    time.Duration
	total  uint64
	sum    time.Duration
}

const subBuckets = 128

func bucketOf(d time.Duration) int {
	us := d.Microseconds()
	if us < 0 {
		us = 0
	}
	if us < subBuckets {
		return int(us)
	}
	exp := 63 - bits.LeadingZeros64(uint64(us)) - 6 // us in [2^(exp+6), 2^(exp+7))
	mant := int(us>>uint(exp)) - subBuckets/2
	return subBuckets + exp*(subBuckets/2) + mant
}

func bucketUpper(b int) time.Duration {
	if b < subBuckets {
		return time.Duration(b+1) * time.Microsecond
	}
	b -= subBuckets
	exp := b / (subBuckets / 2)
	mant := b%(subBuckets/2) + subBuckets/2
	return time.Duration((mant+1)<<uint(exp)) * time.Microsecond
}

func newHistogram() *histogram { return &histogram{counts: make([]uint64, subBuckets+40*subBuckets/2)} }

func (h *histogram) record(d time.Duration) {
	b := bucketOf(d)
	if b >= len(h.counts) {
		b = len(h.counts) - 1
	}
	h.counts[b]++
	h.total++
	h.sum += d
	if d > h.max {
		h.max = d
	}
}

func (h *histogram) merge(o *histogram) {
	for i, c := range o.counts {
		h.counts[i] += c
	}
	h.total += o.total
	h.sum += o.sum
	if o.max > h.max {
		h.max = o.max
	}
}

func (h *histogram) quantile(q float64) time.Duration {
	if h.total == 0 {
		return 0
	}
	rank := uint64(math.Ceil(q * float64(h.total)))
	if rank == 0 {
		rank = 1
	}
	var seen uint64
	for i, c := range h.counts {
		seen += c
		if seen >= rank {
			u := bucketUpper(i)
			if u > h.max {
				return h.max
			}
			return u
		}
	}
	return h.max
}

type worker struct {
	hist     *histogram
	ok       uint64
	statuses map[int]uint64
	errs     map[string]uint64
}

func newWorker() *worker {
	return &worker{hist: newHistogram(), statuses: map[int]uint64{}, errs: map[string]uint64{}}
}

type target struct {
	client      *http.Client
	url         string
	body        []byte
	contentType string
}

func (t *target) do() (int, error) {
	req, err := http.NewRequest(http.MethodPost, t.url, bytes.NewReader(t.body))
	if err != nil {
		return 0, err
	}
	req.Header.Set("Content-Type", t.contentType)
	resp, err := t.client.Do(req)
	if err != nil {
		return 0, err
	}
	_, err = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode, err
}

func shortError(err error) string {
	var netErr interface{ Timeout() bool }
	if errors.As(err, &netErr) && netErr.Timeout() {
		return "timeout"
	}
	s := err.Error()
	if len(s) > 80 {
		s = s[len(s)-80:]
	}
	return s
}

func (w *worker) note(status int, err error, latency time.Duration, measuring bool) {
	if !measuring {
		return
	}
	if err != nil {
		w.errs[shortError(err)]++
		return
	}
	w.statuses[status]++
	if status >= 200 && status < 300 {
		w.ok++
		w.hist.record(latency)
	}
}

type result struct {
	Mode           string            `json:"mode"`
	URL            string            `json:"url"`
	BodyBytes      int               `json:"body_bytes"`
	Connections    int               `json:"connections"`
	TargetRate     float64           `json:"target_rate"`
	DurationS      float64           `json:"duration_s"`
	Sent           uint64            `json:"sent"`
	OK             uint64            `json:"ok"`
	Errors         uint64            `json:"errors"`
	Late           uint64            `json:"late"`
	AchievedRate   float64           `json:"achieved_rate"`
	Statuses       map[string]uint64 `json:"statuses"`
	ErrorKinds     map[string]uint64 `json:"error_kinds"`
	P50Ms          float64           `json:"p50_ms"`
	P90Ms          float64           `json:"p90_ms"`
	P99Ms          float64           `json:"p99_ms"`
	P999Ms         float64           `json:"p999_ms"`
	MaxMs          float64           `json:"max_ms"`
	MeanMs         float64           `json:"mean_ms"`
	ClientCPUS     float64           `json:"client_cpu_s"`
	MeasureStartNs int64             `json:"measure_start_unix_ns"`
	MeasureEndNs   int64             `json:"measure_end_unix_ns"`
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

func main() {
	url := flag.String("url", "", "HTTPS URL to POST to")
	bodyFile := flag.String("body", "", "file whose bytes are the request body")
	caFile := flag.String("ca", "", "PEM CA that signed the server certificate")
	certFile := flag.String("cert", "", "PEM client certificate (mutual TLS, e.g. a kube-apiserver admin)")
	keyFile := flag.String("key", "", "PEM private key of -cert")
	contentType := flag.String("content-type", "application/json", "Content-Type header")
	connections := flag.Int("connections", 16, "keep-alive connections (closed loop: workers)")
	rate := flag.Float64("rate", 0, "arrivals per second (open loop); 0 = closed loop")
	duration := flag.Duration("duration", 10*time.Second, "measured time")
	warmup := flag.Duration("warmup", 2*time.Second, "unmeasured load before the measured time")
	timeout := flag.Duration("timeout", 10*time.Second, "per-request timeout")
	startFile := flag.String("mark", "", "file to write 'start' to when measuring begins and 'end' when it ends")
	flag.Parse()
	if *url == "" || *bodyFile == "" {
		fmt.Fprintln(os.Stderr, "loadgen: -url and -body are required")
		os.Exit(2)
	}
	body, err := os.ReadFile(*bodyFile)
	if err != nil {
		fmt.Fprintln(os.Stderr, "loadgen:", err)
		os.Exit(2)
	}
	tlsConfig := &tls.Config{MinVersion: tls.VersionTLS12}
	if *caFile != "" {
		pem, err := os.ReadFile(*caFile)
		if err != nil {
			fmt.Fprintln(os.Stderr, "loadgen:", err)
			os.Exit(2)
		}
		pool := x509.NewCertPool()
		pool.AppendCertsFromPEM(pem)
		tlsConfig.RootCAs = pool
	}
	if *certFile != "" {
		pair, err := tls.LoadX509KeyPair(*certFile, *keyFile)
		if err != nil {
			fmt.Fprintln(os.Stderr, "loadgen:", err)
			os.Exit(2)
		}
		tlsConfig.Certificates = []tls.Certificate{pair}
	}
	transport := &http.Transport{
		TLSClientConfig:     tlsConfig,
		MaxConnsPerHost:     *connections,
		MaxIdleConnsPerHost: *connections,
		MaxIdleConns:        *connections,
		ForceAttemptHTTP2:   false,
		DisableCompression:  true,
		IdleConnTimeout:     time.Minute,
	}
	t := &target{client: &http.Client{Transport: transport, Timeout: *timeout}, url: *url, body: body, contentType: *contentType}

	var measuring atomic.Bool
	mark := func(s string) {
		if *startFile != "" {
			_ = os.WriteFile(*startFile, []byte(s+" "+strconv.FormatInt(time.Now().UnixNano(), 10)+"\n"), 0o644)
		}
	}
	cpu0 := processCPU()
	began := time.Now()
	measureFrom := began.Add(*warmup)
	stopAt := measureFrom.Add(*duration)
	var workers []*worker
	var late uint64
	var sent atomic.Uint64
	go func() {
		time.Sleep(time.Until(measureFrom))
		measuring.Store(true)
		mark("start")
	}()

	// spawn runs body on one goroutine per connection, each with its own worker.
	spawn := func(body func(w *worker)) *sync.WaitGroup {
		var wg sync.WaitGroup
		for i := 0; i < *connections; i++ {
			w := newWorker()
			workers = append(workers, w)
			wg.Add(1)
			go func() {
				defer wg.Done()
				body(w)
			}()
		}
		return &wg
	}

	if *rate <= 0 {
		spawn(func(w *worker) {
			for time.Now().Before(stopAt) {
				start := time.Now()
				m := measuring.Load()
				status, err := t.do()
				if m {
					sent.Add(1)
				}
				w.note(status, err, time.Since(start), m)
			}
		}).Wait()
	} else {
		// One dispatcher issues due requests into a bounded pool of senders (one per connection);
		// a request's latency counts from its due instant.
		type job struct {
			due     time.Time
			measure bool
		}
		jobs := make(chan job, 1<<20)
		wg := spawn(func(w *worker) {
			for j := range jobs {
				if time.Now().After(stopAt.Add(*timeout)) {
					if j.measure {
						atomic.AddUint64(&late, 1)
					}
					continue
				}
				status, err := t.do()
				if j.measure {
					sent.Add(1)
				}
				w.note(status, err, time.Since(j.due), j.measure)
			}
		})
		interval := time.Duration(float64(time.Second) / *rate)
		for i := int64(0); ; i++ {
			due := began.Add(time.Duration(i) * interval)
			if !due.Before(stopAt) {
				break
			}
			if d := time.Until(due); d > 0 {
				time.Sleep(d)
			}
			jobs <- job{due: due, measure: !due.Before(measureFrom)}
		}
		close(jobs)
		wg.Wait()
	}
	mark("end")
	end := time.Now()
	measured := *duration
	if *rate <= 0 {
		measured = end.Sub(measureFrom)
	}
	cpu1 := processCPU()

	all := newWorker()
	for _, w := range workers {
		all.hist.merge(w.hist)
		all.ok += w.ok
		for k, v := range w.statuses {
			all.statuses[k] += v
		}
		for k, v := range w.errs {
			all.errs[k] += v
		}
	}
	var errCount uint64
	statuses := map[string]uint64{}
	for k, v := range all.statuses {
		statuses[strconv.Itoa(k)] = v
		if k < 200 || k >= 300 {
			errCount += v
		}
	}
	for _, v := range all.errs {
		errCount += v
	}
	mode := "closed"
	if *rate > 0 {
		mode = "open"
	}
	mean := 0.0
	if all.hist.total > 0 {
		mean = ms(all.hist.sum) / float64(all.hist.total)
	}
	r := result{
		Mode: mode, URL: *url, BodyBytes: len(body), Connections: *connections, TargetRate: *rate,
		DurationS: measured.Seconds(), Sent: sent.Load(), OK: all.ok, Errors: errCount, Late: late,
		AchievedRate: float64(all.ok) / measured.Seconds(), Statuses: statuses, ErrorKinds: all.errs,
		P50Ms: ms(all.hist.quantile(0.50)), P90Ms: ms(all.hist.quantile(0.90)), P99Ms: ms(all.hist.quantile(0.99)),
		P999Ms: ms(all.hist.quantile(0.999)), MaxMs: ms(all.hist.max), MeanMs: mean,
		ClientCPUS: cpu1 - cpu0, MeasureStartNs: measureFrom.UnixNano(), MeasureEndNs: end.UnixNano(),
	}
	out, _ := json.MarshalIndent(r, "", "  ")
	fmt.Println(string(out))
}
