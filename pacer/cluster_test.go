package pacer

import (
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/llmbulkhead/bulkhead/internal/redistest"
)

// TestRedisCluster runs the Redis store on a three-master Redis Cluster:
// pacer keys of different call keys spread over the nodes, a composite
// decides atomically over the members' keys (one slot, by the hash tag), and
// decisions survive flushed script caches.
func TestRedisCluster(t *testing.T) {
	if testing.Short() {
		t.Skip("starting a cluster takes seconds")
	}
	cluster := redistest.StartCluster(t, 3)
	client := redis.NewClusterClient(&redis.ClusterOptions{Addrs: cluster.Addrs(), DialerRetries: 1})
	t.Cleanup(func() { client.Close() })
	clk := newManualClock(startEpoch)
	store := newRedisStore(t, client, RedisOptions{Clock: clk})
	if err := store.Preload(bg); err != nil {
		t.Fatal(err)
	}
	rpm := mustNew(t, store, Options{Name: "rpm", QPS: 10})
	tpm := mustNew(t, store, Options{Name: "tpm", QPS: 1000})
	comp, err := NewComposite(rpm, tpm)
	if err != nil {
		t.Fatal(err)
	}

	const keys = 30
	for i := 0; i < keys; i++ {
		key := "model-" + strconv.Itoa(i)
		if out, err := comp.RateLimit(bg, key, 1, 100); err != nil || out.Delay != 0 {
			t.Fatalf("%s: %+v, %v", key, out, err)
		}
		out, err := comp.RateLimit(bg, key, 1, 100)
		if err != nil || out.Pacer != rpm || out.Delay != 100*time.Millisecond {
			t.Fatalf("%s: %+v, %v; want rpm's 100ms", key, out, err)
		}
	}
	perNode := make([]int, len(cluster.Nodes))
	total := 0
	for i, n := range cluster.Nodes {
		size, err := n.Do("DBSIZE")
		if err != nil {
			t.Fatal(err)
		}
		perNode[i], _ = strconv.Atoi(size)
		total += perNode[i]
	}
	if total != 2*keys {
		t.Fatalf("%d keys in the cluster, want %d", total, 2*keys)
	}
	for i, n := range perNode {
		if n == 0 {
			t.Errorf("node %d holds no pacer key: %v", i, perNode)
		}
	}

	for _, n := range cluster.Nodes {
		if _, err := n.Do("SCRIPT", "FLUSH"); err != nil {
			t.Fatal(err)
		}
	}
	clk.Add(time.Second)
	for i := 0; i < keys; i++ {
		if out, err := comp.Pace(bg, "model-"+strconv.Itoa(i), 1, 100); err != nil || out.Delay != 0 {
			t.Fatalf("after SCRIPT FLUSH: %+v, %v", out, err)
		}
	}
}
