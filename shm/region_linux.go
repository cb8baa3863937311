package shm

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"strconv"

	"github.com/edsrzf/mmap-go"
	"golang.org/x/sys/unix"
)

type mappings struct{ data, readers mmap.MMap }

func memfd(name string, size uint64) (*os.File, error) {
	fd, err := unix.MemfdCreate(name, unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
	if err != nil {
		return nil, fmt.Errorf("%w: memfd_create: %w", ErrUnsupported, err)
	}
	f := os.NewFile(uintptr(fd), name)
	if err := f.Truncate(int64(size)); err != nil {
		f.Close()
		return nil, fmt.Errorf("shmsteer: sizing region to %d bytes: %w", size, err)
	}
	return f, nil
}

func (r *Region) createFiles() (err error) {
	defer func() {
		if err != nil {
			r.unmap()
		}
	}()
	if r.files[0], err = memfd("shmsteer-data", r.l.totalSize); err != nil {
		return err
	}
	if r.files[1], err = memfd("shmsteer-readers", readersSize(r.l.readerSlots)); err != nil {
		return err
	}
	if r.maps.data, err = mmap.MapRegion(r.files[0], int(r.l.totalSize), mmap.RDWR, 0, 0); err != nil {
		return fmt.Errorf("shmsteer: mapping region: %w", err)
	}
	if r.maps.readers, err = mmap.MapRegion(r.files[1], int(readersSize(r.l.readerSlots)), mmap.RDWR, 0, 0); err != nil {
		return fmt.Errorf("shmsteer: mapping reader slots: %w", err)
	}
	r.data, r.readers = r.maps.data, r.maps.readers
	return nil
}

// seal fixes both files' sizes and forbids new writable mappings of the data, so readers can
// only map it read-only. The owner's existing read-write mapping keeps working.
func (r *Region) seal() error {
	if _, err := unix.FcntlInt(r.files[0].Fd(), unix.F_ADD_SEALS,
		unix.F_SEAL_SHRINK|unix.F_SEAL_GROW|unix.F_SEAL_FUTURE_WRITE|unix.F_SEAL_SEAL); err != nil {
		return fmt.Errorf("shmsteer: sealing region: %w", err)
	}
	if _, err := unix.FcntlInt(r.files[1].Fd(), unix.F_ADD_SEALS,
		unix.F_SEAL_SHRINK|unix.F_SEAL_GROW|unix.F_SEAL_SEAL); err != nil {
		return fmt.Errorf("shmsteer: sealing reader slots: %w", err)
	}
	return nil
}

func fileSize(f *os.File) (uint64, error) {
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil {
		return 0, fmt.Errorf("shmsteer: stat region file: %w", err)
	}
	if st.Size < 0 {
		return 0, fmt.Errorf("%w: negative size", ErrNotRegion)
	}
	return uint64(st.Size), nil
}

// requireSealed refuses files whose size could still change under the mapping: a shrink would
// turn reads into SIGBUS.
func requireSealed(f *os.File) error {
	seals, err := unix.FcntlInt(f.Fd(), unix.F_GET_SEALS, 0)
	if err != nil {
		return fmt.Errorf("%w: not a sealed memfd: %w", ErrNotRegion, err)
	}
	if seals&unix.F_SEAL_SHRINK == 0 || seals&unix.F_SEAL_GROW == 0 {
		return fmt.Errorf("%w: file size not sealed", ErrNotRegion)
	}
	return nil
}

func (r *Region) openFiles(data, readers *os.File) (err error) {
	defer func() {
		if err != nil {
			r.unmap()
		}
	}()
	for _, f := range []*os.File{data, readers} {
		if err := requireSealed(f); err != nil {
			return err
		}
	}
	dsize, err := fileSize(data)
	if err != nil {
		return err
	}
	rsize, err := fileSize(readers)
	if err != nil {
		return err
	}
	if dsize < headerSize || dsize > maxArenaBytes+headerSize+8*maxIndexSlots+4096 || rsize < lineSize || rsize > readersSize(maxReaderSlots) {
		return fmt.Errorf("%w: file sizes %d and %d out of range", ErrNotRegion, dsize, rsize)
	}
	if r.maps.data, err = mmap.MapRegion(data, int(dsize), mmap.RDONLY, 0, 0); err != nil {
		return fmt.Errorf("shmsteer: mapping region read-only: %w", err)
	}
	if r.l, err = parseHeader(r.maps.data, dsize); err != nil {
		return err
	}
	if r.maps.readers, err = mmap.MapRegion(readers, int(rsize), mmap.RDWR, 0, 0); err != nil {
		return fmt.Errorf("shmsteer: mapping reader slots: %w", err)
	}
	if err := parseReaders(r.maps.readers, rsize, &r.l); err != nil {
		return err
	}
	r.data, r.readers = r.maps.data, r.maps.readers
	return nil
}

func (r *Region) unmap() error {
	var errs []error
	if r.maps.data != nil {
		errs = append(errs, r.maps.data.Unmap())
	}
	if r.maps.readers != nil {
		errs = append(errs, r.maps.readers.Unmap())
	}
	for _, f := range r.files {
		if f != nil {
			errs = append(errs, f.Close())
		}
	}
	return errors.Join(errs...)
}

// selfOwnerWord identifies this process in reader slots: pid and start time, so a reused pid
// is not mistaken for a live reader.
func selfOwnerWord() (uint64, error) {
	pid := os.Getpid()
	start, err := processStart(pid)
	if err != nil {
		return 0, fmt.Errorf("shmsteer: reading own start time: %w", err)
	}
	return uint64(pid)<<32 | uint64(uint32(start)), nil
}

// processStart reads a process's start time (clock ticks since boot) from /proc. It fails for a
// process that does not exist or is a zombie.
func processStart(pid int) (uint64, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, err
	}
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, errors.New("unparsable /proc stat")
	}
	f := bytes.Fields(b[i+1:])
	if len(f) < 20 {
		return 0, errors.New("short /proc stat")
	}
	if f[0][0] == 'Z' || f[0][0] == 'X' {
		return 0, errors.New("process is dead")
	}
	return strconv.ParseUint(string(f[19]), 10, 64)
}

// ownerAlive reports whether the process named by a slot owner word still runs.
func ownerAlive(word uint64) bool {
	start, err := processStart(int(word >> 32))
	return err == nil && uint32(start) == uint32(word)
}
