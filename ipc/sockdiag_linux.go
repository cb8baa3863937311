package ipc

import (
	"encoding/binary"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// Who holds an abstract name that tells nothing through a connection (bound without listening,
// or a backlog kept full)? The kernel's socket diagnostics (NETLINK_SOCK_DIAG, unix_diag)
// list every unix socket of the network namespace with its name, inode and owner's uid; the
// pid is found, where /proc lets this process see it, by the inode among /proc/PID/fd.

const (
	udiagShowName = 0x01 // UDIAG_SHOW_NAME
	udiagShowUID  = 0x40 // UDIAG_SHOW_UID (Linux 5.3)
	unixDiagName  = 0    // UNIX_DIAG_NAME attribute
	unixDiagUID   = 7    // UNIX_DIAG_UID attribute
	unixDiagReqSz = 24   // struct unix_diag_req
	unixDiagMsgSz = 16   // struct unix_diag_msg
)

// abstractHolder finds the socket bound to the abstract name (without its leading NUL): its
// uid from the kernel, and a pid that holds it if one can be seen in /proc (pid 0 if not).
func abstractHolder(name string) (l listener, err error) {
	var ino uint32
	found := false
	err = eachUnixSocket(func(sockName string, uid int, hasUID bool, inode uint32) bool {
		if sockName == "\x00"+name && hasUID {
			found, ino = true, inode
			l = listener{uid: uid, known: true}
			return false
		}
		return true
	})
	if err != nil {
		return listener{}, err
	}
	if !found {
		return listener{}, fmt.Errorf("no socket bound to the name")
	}
	l.pid = pidOfSocket(ino)
	return l, nil
}

// abstractNames lists the abstract names (without the leading NUL) bound in this network
// namespace by a socket whose owner's uid the kernel tells and for which match is true, each
// once (a listener's accepted connections share its name).
func abstractNames(match func(name string, uid int) bool) ([]string, error) {
	seen := map[string]bool{}
	var names []string
	err := eachUnixSocket(func(sockName string, uid int, hasUID bool, _ uint32) bool {
		if name, ok := strings.CutPrefix(sockName, "\x00"); ok && hasUID && !seen[name] && match(name, uid) {
			seen[name] = true
			names = append(names, name)
		}
		return true
	})
	return names, err
}

// eachUnixSocket dumps every unix socket of the network namespace through the kernel's socket
// diagnostics and calls fn with its name (abstract names start with NUL; "" if unbound), its
// owner's uid, if the kernel told it, and its inode, until fn returns false.
func eachUnixSocket(fn func(name string, uid int, hasUID bool, ino uint32) bool) error {
	fd, err := unix.Socket(unix.AF_NETLINK, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, unix.NETLINK_SOCK_DIAG)
	if err != nil {
		return fmt.Errorf("sock_diag socket: %w", err)
	}
	defer unix.Close(fd)
	req := make([]byte, unix.NLMSG_HDRLEN+unixDiagReqSz)
	binary.NativeEndian.PutUint32(req[0:], uint32(len(req)))
	binary.NativeEndian.PutUint16(req[4:], unix.SOCK_DIAG_BY_FAMILY)
	binary.NativeEndian.PutUint16(req[6:], unix.NLM_F_REQUEST|unix.NLM_F_DUMP)
	binary.NativeEndian.PutUint32(req[8:], 1) // sequence
	r := req[unix.NLMSG_HDRLEN:]
	r[0] = unix.AF_UNIX
	binary.NativeEndian.PutUint32(r[4:], 0xffffffff) // every state
	binary.NativeEndian.PutUint32(r[12:], udiagShowName|udiagShowUID)
	if err := unix.Sendto(fd, req, 0, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		return fmt.Errorf("sock_diag request: %w", err)
	}
	buf := make([]byte, 64<<10)
	more := true
	for {
		n, _, err := unix.Recvfrom(fd, buf, 0)
		if err != nil {
			return fmt.Errorf("sock_diag reply: %w", err)
		}
		msgs, err := syscall.ParseNetlinkMessage(buf[:n])
		if err != nil {
			return fmt.Errorf("sock_diag reply: %w", err)
		}
		for _, m := range msgs {
			switch m.Header.Type {
			case unix.NLMSG_DONE:
				return nil
			case unix.NLMSG_ERROR:
				return fmt.Errorf("sock_diag: the kernel refused the request")
			}
			if !more || len(m.Data) < unixDiagMsgSz {
				continue // drain the dump, so the reply ends with its NLMSG_DONE
			}
			var sockName string
			uid, hasUID := 0, false
			for a := m.Data[unixDiagMsgSz:]; len(a) >= unix.SizeofRtAttr; {
				alen := int(binary.NativeEndian.Uint16(a))
				if alen < unix.SizeofRtAttr || alen > len(a) {
					break
				}
				val := a[unix.SizeofRtAttr:alen]
				switch binary.NativeEndian.Uint16(a[2:]) {
				case unixDiagName:
					sockName = string(val)
				case unixDiagUID:
					if len(val) >= 4 {
						uid, hasUID = int(binary.NativeEndian.Uint32(val)), true
					}
				}
				a = a[min((alen+unix.RTA_ALIGNTO-1)&^(unix.RTA_ALIGNTO-1), len(a)):]
			}
			more = fn(sockName, uid, hasUID, binary.NativeEndian.Uint32(m.Data[4:]))
		}
	}
}

// pidOfSocket finds a process holding the socket inode among the /proc/PID/fd this process
// may read (its own uid's, or all as root); 0 if none is visible.
func pidOfSocket(ino uint32) int {
	target := "socket:[" + strconv.FormatUint(uint64(ino), 10) + "]"
	procs, _ := os.ReadDir("/proc")
	for _, p := range procs {
		pid, err := strconv.Atoi(p.Name())
		if err != nil {
			continue
		}
		fds, _ := os.ReadDir(filepath.Join("/proc", p.Name(), "fd"))
		for _, f := range fds {
			if l, err := os.Readlink(filepath.Join("/proc", p.Name(), "fd", f.Name())); err == nil && l == target {
				return pid
			}
		}
	}
	return 0
}
