// memberlist-ref: HashiCorp memberlist on loopback, measured the way bench/membership.py
// measures ulnet, printing one JSON object.
//
//	go run . -nodes 32 -profile local|lan
//
// All nodes live in this one process, each with its own UDP/TCP port on 127.0.0.1. A
// "kill" is Shutdown() without Leave(): the node stops answering at once, which the
// others see exactly as a crashed process (no goodbye is sent).
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"log"
	"os"
	"sync/atomic"
	"time"

	"github.com/hashicorp/memberlist"
)

// countingTransport counts the datagrams (gossip, probes, acks) a node sends.
type countingTransport struct {
	*memberlist.NetTransport
	sent *atomic.Int64
}

func (t *countingTransport) WriteTo(b []byte, addr string) (time.Time, error) {
	t.sent.Add(1)
	return t.NetTransport.WriteTo(b, addr)
}

func (t *countingTransport) WriteToAddress(b []byte, a memberlist.Address) (time.Time, error) {
	t.sent.Add(1)
	return t.NetTransport.WriteToAddress(b, a)
}

type node struct {
	list *memberlist.Memberlist
	sent *atomic.Int64
}

func start(name string, port int, profile string) (*node, error) {
	var cfg *memberlist.Config
	if profile == "local" {
		cfg = memberlist.DefaultLocalConfig()
	} else {
		cfg = memberlist.DefaultLANConfig()
	}
	cfg.Name = name
	cfg.BindAddr = "127.0.0.1"
	cfg.BindPort = port
	cfg.AdvertisePort = port
	cfg.LogOutput = io.Discard
	nt, err := memberlist.NewNetTransport(&memberlist.NetTransportConfig{
		BindAddrs: []string{"127.0.0.1"}, BindPort: port, Logger: log.New(io.Discard, "", 0),
	})
	if err != nil {
		return nil, err
	}
	sent := &atomic.Int64{}
	cfg.Transport = &countingTransport{nt, sent}
	l, err := memberlist.Create(cfg)
	if err != nil {
		return nil, err
	}
	return &node{l, sent}, nil
}

func alive(n *node) int { return n.list.NumMembers() }

func waitAll(nodes []*node, want int, limit time.Duration) (time.Duration, bool) {
	start := time.Now()
	for time.Since(start) < limit {
		ok := true
		for _, n := range nodes {
			if alive(n) != want {
				ok = false
				break
			}
		}
		if ok {
			return time.Since(start), true
		}
		time.Sleep(5 * time.Millisecond)
	}
	return time.Since(start), false
}

func main() {
	count := flag.Int("nodes", 32, "nodes")
	profile := flag.String("profile", "lan", "local or lan")
	base := flag.Int("port", 27000, "first port (below the ephemeral range)")
	window := flag.Duration("window", 10*time.Second, "steady-state packet counting window")
	flag.Parse()
	var nodes []*node
	for i := 0; i < *count; i++ {
		n, err := start(fmt.Sprintf("m%d", i), *base+i, *profile)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		if i > 0 {
			if _, err := n.list.Join([]string{fmt.Sprintf("127.0.0.1:%d", *base)}); err != nil {
				fmt.Fprintln(os.Stderr, err)
				os.Exit(1)
			}
		}
		nodes = append(nodes, n)
	}
	if _, ok := waitAll(nodes, *count, 60*time.Second); !ok {
		fmt.Fprintln(os.Stderr, "memberlist did not converge")
		os.Exit(1)
	}
	time.Sleep(2 * time.Second)
	// Steady state: datagrams per node per second.
	before := int64(0)
	for _, n := range nodes {
		before += n.sent.Load()
	}
	time.Sleep(*window)
	after := int64(0)
	for _, n := range nodes {
		after += n.sent.Load()
	}
	pps := float64(after-before) / window.Seconds() / float64(*count)
	// Join of one more node until all agree.
	joiner, err := start(fmt.Sprintf("m%d", *count), *base+*count, *profile)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	t0 := time.Now()
	if _, err := joiner.list.Join([]string{fmt.Sprintf("127.0.0.1:%d", *base)}); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	all := append(append([]*node{}, nodes...), joiner)
	_, okJoin := waitAll(all, *count+1, 60*time.Second)
	join := time.Since(t0)
	time.Sleep(2 * time.Second)
	// Kill one (not the seed) and time the agreed view without it.
	victim := *count / 2
	t1 := time.Now()
	all[victim].list.Shutdown()
	survivors := append(append([]*node{}, all[:victim]...), all[victim+1:]...)
	_, okKill := waitAll(survivors, *count, 120*time.Second)
	kill := time.Since(t1)
	out := map[string]interface{}{
		"peer": "memberlist", "profile": *profile, "nodes": *count,
		"packets_per_node_s": pps, "join_s": join.Seconds(), "join_ok": okJoin,
		"kill_to_view_s": kill.Seconds(), "kill_ok": okKill,
	}
	b, _ := json.Marshal(out)
	fmt.Println(string(b))
	for _, n := range survivors {
		n.list.Shutdown()
	}
}
