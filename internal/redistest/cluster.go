package redistest

import (
	"fmt"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"
)

// Cluster is a Redis Cluster of masters only (no replicas) on loopback.
type Cluster struct {
	// Nodes are the cluster's masters; together they serve all 16384 slots.
	Nodes []*Server
}

// StartCluster starts a Redis Cluster of n masters (at least 3, as
// redis-cli requires), each with its own free port and cluster bus port,
// assigns the slots with redis-cli --cluster create, waits until every node
// reports cluster_state:ok, and stops the nodes when tb ends.
func StartCluster(tb testing.TB, n int) *Cluster {
	tb.Helper()
	if n < 3 {
		tb.Fatalf("redistest: a cluster needs at least 3 masters, got %d", n)
	}
	bin := binary(tb, "redis-server")
	cli := binary(tb, "redis-cli")
	var lastErr error
	for attempt := 0; attempt < 3; attempt++ {
		c, err := startCluster(tb, bin, cli, n)
		if err == nil {
			return c
		}
		lastErr = err
	}
	tb.Fatalf("redistest: %v", lastErr)
	return nil
}

func startCluster(tb testing.TB, bin, cli string, n int) (*Cluster, error) {
	ports, err := freePorts(2 * n)
	if err != nil {
		return nil, err
	}
	c := &Cluster{}
	ok := false
	defer func() {
		if !ok {
			c.Stop()
		}
	}()
	for i := 0; i < n; i++ {
		s := newServer(tb, ports[i], []string{
			"--cluster-enabled", "yes",
			"--cluster-config-file", "nodes.conf",
			"--cluster-node-timeout", "5000",
			"--cluster-port", strconv.Itoa(ports[n+i]),
		})
		if err := s.start(bin); err != nil {
			return nil, err
		}
		c.Nodes = append(c.Nodes, s)
	}
	args := append([]string{"--cluster", "create"}, c.Addrs()...)
	args = append(args, "--cluster-replicas", "0", "--cluster-yes")
	out, err := exec.Command(cli, args...).CombinedOutput()
	if err != nil {
		return nil, fmt.Errorf("redis-cli --cluster create: %w: %s", err, out)
	}
	if err := c.waitOK(); err != nil {
		return nil, err
	}
	ok = true
	tb.Cleanup(c.Stop)
	return c, nil
}

// waitOK waits until every node reports cluster_state:ok and knows every
// other node.
func (c *Cluster) waitOK() error {
	deadline := time.Now().Add(startTimeout)
	want := "cluster_known_nodes:" + strconv.Itoa(len(c.Nodes))
	for {
		ready := 0
		var last string
		for _, s := range c.Nodes {
			info, err := s.Do("CLUSTER", "INFO")
			if err == nil && strings.Contains(info, "cluster_state:ok") && strings.Contains(info, want) {
				ready++
			} else {
				last = fmt.Sprintf("%s: %q %v", s.Addr(), info, err)
			}
		}
		if ready == len(c.Nodes) {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("cluster not ready within %v: %s", startTimeout, last)
		}
		time.Sleep(10 * time.Millisecond) // polling the cluster until it is ready
	}
}

// Addrs returns the nodes' addresses.
func (c *Cluster) Addrs() []string {
	addrs := make([]string, len(c.Nodes))
	for i, s := range c.Nodes {
		addrs[i] = s.Addr()
	}
	return addrs
}

// Stop stops every node.
func (c *Cluster) Stop() {
	for _, s := range c.Nodes {
		s.Stop()
	}
}
