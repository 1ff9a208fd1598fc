package redistest

import "syscall"

// sysProcAttr makes the server die with the test process, so a killed test
// run leaves no redis-server behind.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
