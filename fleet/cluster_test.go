package fleet

import (
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/llmbulkhead/bulkhead/internal/redistest"
)

// TestCluster runs pools on a three-master Redis Cluster: each pool's keys
// share one slot, every script runs without CROSSSLOT errors, several pools
// spread over the masters, and flushed script caches are refilled.
func TestCluster(t *testing.T) {
	if testing.Short() {
		t.Skip("starting a cluster takes seconds")
	}
	cluster := redistest.StartCluster(t, 3)
	client := redis.NewClusterClient(&redis.ClusterOptions{Addrs: cluster.Addrs(), DialerRetries: 1, ContextTimeoutEnabled: true})
	t.Cleanup(func() { client.Close() })

	const pools = 12
	masters := map[string]bool{}
	for i := 0; i < pools; i++ {
		cfg := testConfig(client)
		cfg.Pool = "model-" + strconv.Itoa(i)
		cfg.AdjustMinInterval = -1
		p := mustPool(t, cfg)
		slot := func(key string) int64 {
			s, err := client.ClusterKeySlot(bg, key).Result()
			if err != nil {
				t.Fatal(err)
			}
			return s
		}
		for _, k := range p.st.keys[1:] {
			if slot(k) != slot(p.st.keys[0]) {
				t.Fatalf("keys %v in different slots", p.st.keys)
			}
		}
		addr, err := client.MasterForKey(bg, p.st.keys[0])
		if err != nil {
			t.Fatal(err)
		}
		masters[addr.Options().Addr] = true

		reserveOK(t, p, idn(1), Hold{1, 100}, false)
		reserveOK(t, p, idn(2), Hold{1, 200}, true)
		p.Adjust(idn(1), Hold{1, 50}, 1)
		p.Release(idn(2))
		poll(t, 5*time.Second, "release and adjust", func() bool {
			l := checkLedger(t, client, p.st.keys)
			return l.slots == 1 && l.tokens == 50
		})
		p.renewAll()
		e := p.Stats().Errors
		if n := e.Reserve.Other + e.Release.Other + e.Adjust.Other + e.Renew.Other; n != 0 || p.Stats().Renews.Renewed != 1 {
			t.Fatalf("stats %+v", p.Stats())
		}
		if i == pools/2 {
			for _, n := range cluster.Nodes {
				if _, err := n.Do("SCRIPT", "FLUSH"); err != nil {
					t.Fatal(err)
				}
			}
		}
		if err := p.Close(bg); err != nil {
			t.Fatal(err)
		}
		if l := checkLedger(t, client, p.st.keys); len(l.holds) != 0 {
			t.Fatalf("after Close: %+v", l)
		}
	}
	if len(masters) < 2 {
		t.Errorf("%d pools all on one master", pools)
	}
}

// TestClusterNodeRestartFromSnapshot restarts the cluster node that serves
// a pool from its RDB snapshot, and lets a replica that saw none of the
// writes the restart lost call first (see restartFromSnapshot): the
// scripts must tell the restarted node from the one that wrote the state.
func TestClusterNodeRestartFromSnapshot(t *testing.T) {
	if testing.Short() {
		t.Skip("starting a cluster takes seconds")
	}
	cluster := redistest.StartCluster(t, 3)
	clients := func() redis.UniversalClient {
		c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: cluster.Addrs(), DialerRetries: 1, ContextTimeoutEnabled: true})
		t.Cleanup(func() { c.Close() })
		return c
	}
	cfg := testConfig(clients())
	s, err := cfg.settings()
	if err != nil {
		t.Fatal(err)
	}
	master, err := cfg.Client.(*redis.ClusterClient).MasterForKey(bg, newStore(&s).keys[0])
	if err != nil {
		t.Fatal(err)
	}
	var node *redistest.Server
	for _, n := range cluster.Nodes {
		if n.Addr() == master.Options().Addr {
			node = n
		}
	}
	if node == nil {
		t.Fatalf("no node at %s", master.Options().Addr)
	}
	restartFromSnapshot(t, cfg, clients, node, func() {
		node.Restart()
		poll(t, 10*time.Second, "the cluster", func() bool {
			info, err := node.Do("CLUSTER", "INFO")
			return err == nil && strings.Contains(info, "cluster_state:ok")
		})
	})
}
