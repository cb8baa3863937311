package serve

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"encoding/gob"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/shmsteer/shmsteer/steer"
)

// The state file: a 64-byte header, then a gob payload.
//
//	0  magic "SHMSTEER-STATE\n\x00" (16 bytes)
//	16 u32 format version, 20 u32 0
//	24 u64 payload length
//	32 [32]byte sha256 of the payload
const (
	stateMagic   = "SHMSTEER-STATE\n\x00"
	stateVersion = 1
	stateHeader  = 64
	stateFile    = "state.bin"
	tmpInfix     = ".tmp-" // in the names of writeAtomic's temporary files
)

// persisted is everything that survives a restart. Keys are never part of it.
type persisted struct {
	Model      steer.ModelConfig
	Vectors    []namedDigest // each named vector's digest; its encoding is in vectors/<digest>
	Probes     []namedDigest // each probe vector's digest, stored like Vectors' (absent before probes: none)
	Global     []byte        // steer wire encoding of the global tiers; nil if none
	Modules    []namedWire   // steer wire encoding of each module
	Latches    []steer.LatchEntry
	LatchStats steer.LatchStats
	// GateConversations are the conversations' rest_of_conversation gates with their engaged
	// state (steer.GateConversations' encoding), oldest first (absent before they were kept).
	GateConversations [][]byte
}

type namedDigest struct {
	Name   string
	Digest steer.Digest
	// ModelHint is a steering vector's model hint (steer.VectorMeta; absent in state files
	// written before hints were kept: none).
	ModelHint string
}

type namedWire struct {
	Name string
	Wire []byte
}

func encodeState(p *persisted) ([]byte, error) {
	var buf bytes.Buffer
	buf.Write(make([]byte, stateHeader))
	if err := gob.NewEncoder(&buf).Encode(p); err != nil {
		return nil, fmt.Errorf("shmsteer: encoding state: %w", err)
	}
	b := buf.Bytes()
	payload := b[stateHeader:]
	copy(b, stateMagic)
	binary.LittleEndian.PutUint32(b[16:], stateVersion)
	binary.LittleEndian.PutUint64(b[24:], uint64(len(payload)))
	sum := sha256.Sum256(payload)
	copy(b[32:], sum[:])
	return b, nil
}

func decodeState(b []byte) (*persisted, error) {
	if len(b) < stateHeader || string(b[:16]) != stateMagic {
		return nil, fmt.Errorf("%w: no state header", ErrStateCorrupt)
	}
	if v := binary.LittleEndian.Uint32(b[16:]); v != stateVersion {
		return nil, fmt.Errorf("%w: format version %d, this build reads %d", ErrStateIncompatible, v, stateVersion)
	}
	if binary.LittleEndian.Uint32(b[20:]) != 0 {
		return nil, fmt.Errorf("%w: reserved header bytes set", ErrStateCorrupt)
	}
	n := binary.LittleEndian.Uint64(b[24:])
	if n != uint64(len(b)-stateHeader) {
		return nil, fmt.Errorf("%w: payload is %d bytes, header says %d (truncated?)", ErrStateCorrupt, len(b)-stateHeader, n)
	}
	payload := b[stateHeader:]
	if sum := sha256.Sum256(payload); !bytes.Equal(sum[:], b[32:64]) {
		return nil, fmt.Errorf("%w: checksum mismatch", ErrStateCorrupt)
	}
	var p persisted
	if err := gob.NewDecoder(bytes.NewReader(payload)).Decode(&p); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrStateCorrupt, err)
	}
	return &p, nil
}

// stateStore is the state directory: locked while serving (flock on the directory itself, so
// no file inside can be deleted out from under the lock), the state file, and vectors/ with one
// file per named vector encoding, named by its digest (written once, so a save rewrites only
// the small state file and new vectors). Everything in it must belong to serve's uid and be
// writable by no one else.
type stateStore struct {
	dir     string
	lock    *os.File              // the directory, flocked
	onDisk  map[steer.Digest]bool // vector files known durable
	tmpGone int                   // temporary files of interrupted saves removed at open
}

// checkPrivate refuses path (described by fi, from Lstat) unless it is a directory or regular
// file (want) of this process's uid that group and others cannot write: serve restores whatever
// the state directory holds, so anyone who can write there could steer every request.
func checkPrivate(path string, fi fs.FileInfo, dir bool) error {
	switch {
	case dir && !fi.IsDir(), !dir && !fi.Mode().IsRegular():
		return fmt.Errorf("%w: %s is a %v, not a %s", ErrStateUnsafe, path, fi.Mode().Type(), map[bool]string{true: "directory", false: "regular file"}[dir])
	}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok && int(st.Uid) != os.Geteuid() {
		return fmt.Errorf("%w: %s belongs to uid %d, serve runs as uid %d: chown it or use another --state-dir", ErrStateUnsafe, path, st.Uid, os.Geteuid())
	}
	if fi.Mode().Perm()&0o022 != 0 {
		return fmt.Errorf("%w: %s is writable by group or others (mode %v): chmod go-w it", ErrStateUnsafe, path, fi.Mode().Perm())
	}
	return nil
}

func lstatPrivate(path string, dir bool) error {
	fi, err := os.Lstat(path)
	if err != nil {
		return fmt.Errorf("shmsteer: state directory: %w", err)
	}
	return checkPrivate(path, fi, dir)
}

func openStateStore(dir string) (*stateStore, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("shmsteer: state directory: %w", err)
	}
	if err := lstatPrivate(dir, true); err != nil {
		return nil, err
	}
	f, err := os.OpenFile(dir, os.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW, 0)
	if err != nil {
		return nil, fmt.Errorf("shmsteer: state directory lock: %w", err)
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		f.Close()
		return nil, fmt.Errorf("%w: %s", ErrStateLocked, dir)
	}
	s := &stateStore{dir: dir, lock: f, onDisk: map[steer.Digest]bool{}}
	if err := s.prepare(); err != nil {
		f.Close()
		return nil, err
	}
	return s, nil
}

// prepare, with the lock held, makes vectors/, checks every entry is private and removes the
// temporary files interrupted saves left (a save never leaves one unless it was killed).
func (s *stateStore) prepare() error {
	vdir := filepath.Join(s.dir, "vectors")
	if err := os.Mkdir(vdir, 0o700); err != nil && !errors.Is(err, fs.ErrExist) {
		return fmt.Errorf("shmsteer: state directory: %w", err)
	}
	if err := lstatPrivate(vdir, true); err != nil {
		return err
	}
	for _, d := range []string{s.dir, vdir} {
		ents, err := os.ReadDir(d)
		if err != nil {
			return fmt.Errorf("shmsteer: state directory: %w", err)
		}
		for _, e := range ents {
			path := filepath.Join(d, e.Name())
			if strings.Contains(e.Name(), tmpInfix) {
				if err := os.Remove(path); err != nil {
					return fmt.Errorf("shmsteer: removing a temporary file of an interrupted save: %w", err)
				}
				s.tmpGone++
				continue
			}
			if d == s.dir && (e.Name() == "vectors" || e.Name() == "lock") {
				continue // vectors/ is checked above; lock is the lock file of older versions
			}
			fi, err := e.Info()
			if err != nil {
				return fmt.Errorf("shmsteer: state directory: %w", err)
			}
			if err := checkPrivate(path, fi, false); err != nil {
				return err
			}
		}
	}
	if s.tmpGone > 0 {
		return syncDir(s.dir)
	}
	return nil
}

func (s *stateStore) close() error { return s.lock.Close() }

// load reads the state file; nil, nil if there is none yet.
func (s *stateStore) load() (*persisted, error) {
	b, err := os.ReadFile(filepath.Join(s.dir, stateFile))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("shmsteer: reading state: %w", err)
	}
	p, err := decodeState(b)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", filepath.Join(s.dir, stateFile), err)
	}
	return p, nil
}

func (s *stateStore) vectorPath(d steer.Digest) string {
	return filepath.Join(s.dir, "vectors", d.String())
}

// readVector reads a named vector's encoding; its digest is checked when it is decoded.
func (s *stateStore) readVector(d steer.Digest) ([]byte, error) {
	b, err := os.ReadFile(s.vectorPath(d))
	if err != nil {
		return nil, fmt.Errorf("%w: vector file: %w", ErrStateCorrupt, err)
	}
	s.onDisk[d] = true
	return b, nil
}

// writeAtomic writes b to path through a temporary file, fsynced and renamed; the caller
// fsyncs the directory.
func writeAtomic(path string, b []byte) error {
	f, err := os.CreateTemp(filepath.Dir(path), filepath.Base(path)+tmpInfix+"*")
	if err != nil {
		return err
	}
	tmp := f.Name()
	_, err = f.Write(b)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, path)
	}
	if err != nil {
		os.Remove(tmp)
	}
	return err
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}

// save writes the vector files p needs that are not on disk yet (wire gives their
// encodings), then the state file through a temporary file, fsync and rename, fsyncing the
// directories in between: a crash at any point leaves the old state or the new one whole.
// Vector files no state refers to any more are removed afterwards.
func (s *stateStore) save(p *persisted, wire func(steer.Digest) ([]byte, error)) error {
	fail := func(err error) error { return fmt.Errorf("shmsteer: writing state in %s: %w", s.dir, err) }
	wrote := false
	keep := map[steer.Digest]bool{}
	for _, v := range slices.Concat(p.Vectors, p.Probes) {
		keep[v.Digest] = true
		if s.onDisk[v.Digest] {
			continue
		}
		b, err := wire(v.Digest)
		if err != nil {
			return fail(err)
		}
		if err := writeAtomic(s.vectorPath(v.Digest), b); err != nil {
			return fail(err)
		}
		wrote = true
	}
	if wrote {
		if err := syncDir(filepath.Join(s.dir, "vectors")); err != nil {
			return fail(err)
		}
		for d := range keep {
			s.onDisk[d] = true
		}
	}
	b, err := encodeState(p)
	if err != nil {
		return err
	}
	if err := writeAtomic(filepath.Join(s.dir, stateFile), b); err != nil {
		return fail(err)
	}
	if err := syncDir(s.dir); err != nil {
		return fail(err)
	}
	for d := range s.onDisk {
		if !keep[d] {
			os.Remove(s.vectorPath(d))
			delete(s.onDisk, d)
		}
	}
	return nil
}
