package bench

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"time"

	"github.com/shmsteer/shmsteer/ipc"
	"github.com/shmsteer/shmsteer/keys"
	"github.com/shmsteer/shmsteer/shm"
)

// keysChildRole is the bench child that attaches to the owner's region like a worker; the
// parent times it round by round. Its arguments are the namespace and a mode: none (the hot
// keys: "get" and "set"), "cold" (uniform random Gets over the 1M cold keys) or "rank" (a
// tensor-parallel rank of the mem.tp8_ratio figure, see tp8bench.go). One role for every
// attached child keeps main's role table unchanged.
const keysChildRole = "shmsteer.keys"

// benchSecret makes sure the bench's owner and its children share a secret: the one in the
// environment, or a fresh random one put there for the children to inherit.
func benchSecret() error {
	if os.Getenv(ipc.SecretEnv) != "" {
		return nil
	}
	var b [32]byte
	if _, err := rand.Read(b[:]); err != nil {
		return err
	}
	return os.Setenv(ipc.SecretEnv, hex.EncodeToString(b[:]))
}

// newKeysOwner starts an owner in a fresh namespace holding the bench's 1024 keys of 32 bytes.
func newKeysOwner() (*ipc.Owner, *keys.Owner, string, error) {
	return newOwnerWithKeys(shm.Config{IndexSlots: 4096, ArenaBytes: 8 << 20}, benchKeys())
}

// newOwner starts an owner of a region of config rc in a fresh namespace, and its key
// registry.
func newOwner(rc shm.Config) (*ipc.Owner, *keys.Owner, string, error) {
	if err := benchSecret(); err != nil {
		return nil, nil, "", err
	}
	var nb [8]byte
	if _, err := rand.Read(nb[:]); err != nil {
		return nil, nil, "", err
	}
	ns := "bench-" + hex.EncodeToString(nb[:])
	o, err := ipc.NewOwner(ipc.OwnerOptions{
		Namespace: ns,
		Region:    rc,
		Logger:    slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	if err != nil {
		return nil, nil, "", err
	}
	reg, err := keys.Open(o, keys.Options{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		o.Close()
		return nil, nil, "", err
	}
	return o, reg, ns, nil
}

// newOwnerWithKeys starts an owner of a region of config rc holding the keys ids, key i with
// value keyValue(i).
func newOwnerWithKeys(rc shm.Config, ids []string) (*ipc.Owner, *keys.Owner, string, error) {
	o, reg, ns, err := newOwner(rc)
	if err != nil {
		return nil, nil, "", err
	}
	for i, k := range ids {
		if err := reg.Set(k, keyValue(i)); err != nil {
			o.Close()
			return nil, nil, "", err
		}
	}
	return o, reg, ns, nil
}

// keysFromChildren starts an owner and k attached child processes and returns each child's op.
func keysFromChildren(op string, k int) ([]Op, func() error, error) {
	procs, cleanup, err := keyReaderProcs(k)
	if err != nil {
		return nil, nil, err
	}
	var ops []Op
	for _, p := range procs {
		ops = append(ops, p.Op(op))
	}
	return ops, cleanup, nil
}

// keyReaderProcs starts an owner of the hot keys and k attached child processes.
func keyReaderProcs(k int) ([]*proc, func() error, error) {
	o, _, ns, err := newKeysOwner()
	if err != nil {
		return nil, nil, err
	}
	return startAttached(o, k, ns)
}

// startAttached starts k children attached to o's namespace with args, and a cleanup that
// closes them and then o.
func startAttached(o *ipc.Owner, k int, args ...string) ([]*proc, func() error, error) {
	var procs []*proc
	cleanup := func() error {
		var errs []error
		for _, p := range procs {
			errs = append(errs, p.Close())
		}
		return errors.Join(append(errs, o.Close())...)
	}
	for range k {
		p, err := startChild(keysChildRole, args...)
		if err != nil {
			_ = cleanup()
			return nil, nil, err
		}
		procs = append(procs, p)
	}
	return procs, cleanup, nil
}

func keysChildSetup(op string) setupFunc {
	return func() (Op, func() error, error) {
		ops, cleanup, err := keysFromChildren(op, 1)
		if err != nil {
			return nil, nil, err
		}
		return ops[0], cleanup, nil
	}
}

// ownerSetKeys is how many distinct keys the owner's Sets cycle through: far more than the
// hot 1,024, so a Set rarely finds its entry's cache lines warm, and each one replaces a live
// value (arena allocation, index update, retirement of the old value).
const ownerSetKeys = 1 << 14

// keysSetOwner is keys.set.owner_ns and keys.set.owner_p99_ns: the owner's own Set, in process,
// each timed alone (so its membarrier passes are in its own sample), over ownerSetKeys distinct
// keys, round-robin.
func keysSetOwner() (func([]time.Duration) error, func() error, error) {
	keys := make([]string, ownerSetKeys)
	for i := range keys {
		keys[i] = fmt.Sprintf("owner-set-%08d-0000-0000-000000000000", i)[:36]
	}
	o, reg, _, err := newOwnerWithKeys(shm.Config{IndexSlots: 4 * ownerSetKeys, ArenaBytes: 32 << 20}, keys)
	if err != nil {
		return nil, nil, err
	}
	val := keyValue(7)
	next := 0
	run := func(lat []time.Duration) error {
		for i := range lat {
			k := keys[next]
			next = (next + 1) % len(keys)
			start := time.Now()
			err := reg.Set(k, val)
			lat[i] = time.Since(start)
			if err != nil {
				return err
			}
		}
		return nil
	}
	return run, o.Close, nil
}

// keysGetCold is keys.get.cold.shmsteer_ns: a child's Get, uniform random over the 1M cold keys.
// The default region's 65,536 index slots cannot hold them: this owner's region has
// coldIndexSlots slots (2 per key) and an arena for 1M values of 32 bytes (each costs its
// value, its 36-byte key and a 40-byte header, rounded up to 128 bytes).
func keysGetCold() (Op, func() error, error) {
	o, _, ns, err := newOwnerWithKeys(shm.Config{IndexSlots: coldIndexSlots, ArenaBytes: coldArenaBytes}, coldKeys())
	if err != nil {
		return nil, nil, err
	}
	procs, cleanup, err := startAttached(o, 1, ns, "cold")
	if err != nil {
		return nil, nil, err
	}
	return procs[0].Op("get"), cleanup, nil
}

const (
	coldIndexSlots = 1 << 21
	coldArenaBytes = coldNumKeys * 128 * 3 / 2
)

// keysChild is the child side: attach with the inherited secret, then serve "get" (through a
// keys.Reader, a worker's per-goroutine read handle) and "set" (an RPC to the owner).
func keysChild(args []string) (map[string]Op, func() error, error) {
	if len(args) < 1 || len(args) > 2 {
		return nil, nil, fmt.Errorf("%s: want the namespace and an optional mode as arguments", keysChildRole)
	}
	c, err := ipc.Attach(ipc.ClientOptions{Namespace: args[0], Timeout: 10 * time.Second})
	if err != nil {
		return nil, nil, err
	}
	reg, err := keys.Attach(c)
	if err != nil {
		c.Close()
		return nil, nil, err
	}
	if len(args) == 2 {
		switch args[1] {
		case "cold":
			return coldChild(c, reg)
		case "rank":
			return rankChild(c, reg)
		}
		c.Close()
		return nil, nil, fmt.Errorf("%s: unknown mode %q", keysChildRole, args[1])
	}
	kr, err := reg.NewReader()
	if err != nil {
		c.Close()
		return nil, nil, err
	}
	keys := benchKeys() // allocated here: separate from anything the owner stored
	buf := make([]byte, 0, valueSize)
	val := keyValue(3)
	pos := 0 // as gomapOp's
	ops := map[string]Op{
		"get": sliceOp(func(n int) error {
			for i := pos; i < pos+n; i++ {
				var err error
				if buf, err = kr.Get(keys[i&(numKeys-1)], buf[:0]); err != nil {
					return err
				}
			}
			pos += n
			return nil
		}),
		"set": goOp(func(n int) error {
			for i := range n {
				if err := reg.Set(keys[i&(numKeys-1)], val); err != nil {
					return err
				}
			}
			return nil
		}),
	}
	return ops, func() error { kr.Close(); return c.Close() }, nil
}

// coldChild serves "get": uniform random Gets over the cold keys through a keys.Reader.
func coldChild(c *ipc.Client, reg *keys.Worker) (map[string]Op, func() error, error) {
	kr, err := reg.NewReader()
	if err != nil {
		c.Close()
		return nil, nil, err
	}
	keys := coldKeys()
	buf := make([]byte, 0, valueSize)
	state := uint64(0x9e3779b97f4a7c15)
	ops := map[string]Op{
		"get": sliceOp(func(n int) error {
			for range n {
				var err error
				if buf, err = kr.Get(keys[coldIndex(&state)], buf[:0]); err != nil {
					return err
				}
			}
			return nil
		}),
	}
	return ops, func() error { kr.Close(); return c.Close() }, nil
}
