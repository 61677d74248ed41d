// etcd-load: the registry benchmark's client load against etcd, through etcd's own Go
// client (gRPC), so that etcd is measured at its best. N clients each put 64-byte values
// one after another (closed loop) for a fixed time; prints one JSON object:
// {"system":"etcd","clients":..,"value_bytes":..,"ops":..,"seconds":..,"updates_per_s":..,
//  "p50_ms":..,"p99_ms":..}
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"sort"
	"strings"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

func main() {
	endpoints := flag.String("endpoints", "127.0.0.1:2379", "comma-separated etcd client URLs")
	clients := flag.Int("clients", 16, "concurrent clients (each one request at a time)")
	valueBytes := flag.Int("value-bytes", 64, "value size")
	seconds := flag.Float64("seconds", 10, "measured time")
	warmup := flag.Float64("warmup", 2, "unmeasured time before")
	flag.Parse()

	eps := strings.Split(*endpoints, ",")
	value := strings.Repeat("v", *valueBytes)
	lat := make([][]time.Duration, *clients)
	var wg sync.WaitGroup
	start := time.Now()
	measureFrom := start.Add(time.Duration(*warmup * float64(time.Second)))
	end := measureFrom.Add(time.Duration(*seconds * float64(time.Second)))
	errs := make(chan error, *clients)
	for c := 0; c < *clients; c++ {
		wg.Add(1)
		go func(c int) {
			defer wg.Done()
			// One connection per client, spread over the members, like independent clients.
			cli, err := clientv3.New(clientv3.Config{Endpoints: []string{eps[c%len(eps)]}, DialTimeout: 5 * time.Second})
			if err != nil {
				errs <- err
				return
			}
			defer cli.Close()
			for i := 0; ; i++ {
				t0 := time.Now()
				if t0.After(end) {
					return
				}
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				_, err := cli.Put(ctx, fmt.Sprintf("bench/%d/%d", c, i%1000), value)
				cancel()
				if err != nil {
					errs <- err
					return
				}
				if t0.After(measureFrom) {
					lat[c] = append(lat[c], time.Since(t0))
				}
			}
		}(c)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		fmt.Fprintln(os.Stderr, "etcd-load:", err)
		os.Exit(1)
	}
	var all []time.Duration
	for _, l := range lat {
		all = append(all, l...)
	}
	if len(all) == 0 {
		fmt.Fprintln(os.Stderr, "etcd-load: no request completed")
		os.Exit(1)
	}
	sort.Slice(all, func(i, j int) bool { return all[i] < all[j] })
	pct := func(p float64) float64 { return float64(all[int(p*float64(len(all)-1))].Microseconds()) / 1000 }
	out := map[string]any{
		"system": "etcd", "clients": *clients, "value_bytes": *valueBytes, "ops": len(all),
		"seconds": *seconds, "updates_per_s": float64(len(all)) / *seconds,
		"p50_ms": pct(0.50), "p99_ms": pct(0.99),
	}
	json.NewEncoder(os.Stdout).Encode(out)
}
