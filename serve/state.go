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
)

// persisted is everything that survives a restart. Keys are never part of it.
type persisted struct {
	Model      steer.ModelConfig
	Vectors    []namedWire // steer wire encoding of each named vector, by name
	Global     []byte      // steer wire encoding of the global tiers; nil if none
	Modules    []namedWire // steer wire encoding of each module
	Latches    []steer.LatchEntry
	LatchStats steer.LatchStats
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

// stateStore is the state directory: a lock file held while serving and the state file.
type stateStore struct {
	dir  string
	lock *os.File
}

func openStateStore(dir string) (*stateStore, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("shmsteer: state directory: %w", err)
	}
	f, err := os.OpenFile(filepath.Join(dir, "lock"), os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, fmt.Errorf("shmsteer: state directory lock: %w", err)
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		f.Close()
		return nil, fmt.Errorf("%w: %s", ErrStateLocked, dir)
	}
	return &stateStore{dir: dir, lock: f}, nil
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

// save writes p to a temporary file, fsyncs it, renames it over the state file and fsyncs the
// directory: a crash at any point leaves the old file or the new one.
func (s *stateStore) save(p *persisted) error {
	b, err := encodeState(p)
	if err != nil {
		return err
	}
	f, err := os.CreateTemp(s.dir, stateFile+".tmp-*")
	if err != nil {
		return fmt.Errorf("shmsteer: writing state: %w", err)
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
		err = os.Rename(tmp, filepath.Join(s.dir, stateFile))
	}
	if err != nil {
		os.Remove(tmp)
		return fmt.Errorf("shmsteer: writing state: %w", err)
	}
	d, err := os.Open(s.dir)
	if err != nil {
		return fmt.Errorf("shmsteer: syncing state directory: %w", err)
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return fmt.Errorf("shmsteer: syncing state directory: %w", err)
	}
	return nil
}
