//go:build unix

package gateway

import (
	"net"
	"syscall"
)

// watch wraps c, when its reads can be watched (a TCP connection).
func watch(c net.Conn) net.Conn {
	sc, ok := c.(syscall.Conn)
	if !ok {
		return c
	}
	raw, err := sc.SyscallConn()
	if err != nil {
		return c
	}
	return newWatchedConn(c, raw)
}

// readFD reads from the connection's descriptor, without waiting.
func readFD(fd uintptr, p []byte) (int, error) { return syscall.Read(int(fd), p) }
