package shm

import (
	"errors"
	"fmt"
	"os"

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
	if dsize < headerSize || dsize > maxDataSize || rsize < lineSize || rsize > readersSize(maxReaderSlots) {
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
	if r.lease, err = openPrivate(readers); err != nil {
		return err
	}
	r.data, r.readers = r.maps.data, r.maps.readers
	return nil
}

// park is Close's last step when Readers of this process are still open: their Gets read
// without a pin (Reader.Get) and may still be reading, so instead of unmapping, both mappings
// are replaced by anonymous memory (parkMapping) and the files are closed; unmap frees the
// parked ranges once the last of those Readers is closed. Should parking fail, the mappings
// stay as they are until then.
func (r *Region) park() error {
	_ = parkMapping(r.maps.data, false)
	_ = parkMapping(r.maps.readers, true)
	var errs []error
	for _, f := range append(r.files[:], r.lease) {
		if f != nil {
			errs = append(errs, f.Close())
		}
	}
	r.files, r.lease = [2]*os.File{}, nil
	return errors.Join(errs...)
}

func (r *Region) unmap() error {
	var errs []error
	if r.maps.data != nil {
		errs = append(errs, r.maps.data.Unmap())
	}
	if r.maps.readers != nil {
		errs = append(errs, r.maps.readers.Unmap())
	}
	for _, f := range append(r.files[:], r.lease) {
		if f != nil {
			errs = append(errs, f.Close())
		}
	}
	return errors.Join(errs...)
}

// allocDesc maps a reader descriptor: anonymous memory of this process only (nil if the system
// gives none: the C reader then falls back to the Go one).
func allocDesc() *descPage {
	b, err := unix.Mmap(-1, 0, len(descPage{}), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		return nil
	}
	return (*descPage)(b)
}

func freeDesc(d *descPage) {
	if d != nil {
		_ = unix.Munmap(d[:])
	}
}

// populate faults in the pages of pool[lo:hi] writable without reading or changing any byte
// (MADV_POPULATE_WRITE, Linux 5.14), the range widened to whole pages (pool starts on a page);
// on an older kernel it does nothing, and the pages fault in as they are written.
func populate(pool []byte, lo, hi uint64) {
	page := uint64(os.Getpagesize()) // the pool's offset in the file is 2 MiB-aligned
	lo &^= page - 1
	hi = min((hi+page-1)&^(page-1), uint64(len(pool)))
	if lo < hi {
		_ = unix.Madvise(pool[lo:hi], unix.MADV_POPULATE_WRITE)
	}
}
