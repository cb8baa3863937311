package main

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"time"

	"github.com/shmsteer/shmsteer/bench"
	"github.com/shmsteer/shmsteer/ipc"
	"github.com/shmsteer/shmsteer/shm"
)

// keysChildRole is the bench child that attaches to the owner's region like a worker and
// reads or writes keys; the parent times it round by round.
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
func newKeysOwner() (*ipc.Owner, string, error) {
	if err := benchSecret(); err != nil {
		return nil, "", err
	}
	var nb [8]byte
	if _, err := rand.Read(nb[:]); err != nil {
		return nil, "", err
	}
	ns := "bench-" + hex.EncodeToString(nb[:])
	o, err := ipc.NewOwner(ipc.OwnerOptions{
		Namespace: ns,
		Region:    shm.Config{IndexSlots: 4096, ArenaBytes: 8 << 20},
		Logger:    slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	if err != nil {
		return nil, "", err
	}
	for i, k := range bench.Keys() {
		if err := o.Keys().Set(k, bench.Value(i)); err != nil {
			o.Close()
			return nil, "", err
		}
	}
	return o, ns, nil
}

// keysFromChildren starts an owner and k attached child processes and returns each child's op.
func keysFromChildren(op string, k int) ([]bench.Op, func() error, error) {
	o, ns, err := newKeysOwner()
	if err != nil {
		return nil, nil, err
	}
	var procs []*bench.Proc
	cleanup := func() error {
		var errs []error
		for _, p := range procs {
			errs = append(errs, p.Close())
		}
		return errors.Join(append(errs, o.Close())...)
	}
	var ops []bench.Op
	for range k {
		p, err := bench.StartChild(keysChildRole, ns)
		if err != nil {
			cleanup()
			return nil, nil, err
		}
		procs = append(procs, p)
		ops = append(ops, p.Op(op))
	}
	return ops, cleanup, nil
}

func keysChildSetup(op string) bench.Setup {
	return func() (bench.Op, func() error, error) {
		ops, cleanup, err := keysFromChildren(op, 1)
		if err != nil {
			return nil, nil, err
		}
		return ops[0], cleanup, nil
	}
}

// keysSetOwner is keys.set.owner_ns: the owner's own Set, in process.
func keysSetOwner() (bench.Op, func() error, error) {
	o, _, err := newKeysOwner()
	if err != nil {
		return nil, nil, err
	}
	keys := bench.Keys()
	val := bench.Value(7)
	op := bench.GoOp(func(n int) error {
		for i := range n {
			if err := o.Keys().Set(keys[i&(bench.NumKeys-1)], val); err != nil {
				return err
			}
		}
		return nil
	})
	return op, o.Close, nil
}

// keysChild is the child side: attach with the inherited secret, then serve "get" (through a
// KeyReader, a worker's per-goroutine read handle) and "set" (an RPC to the owner).
func keysChild(args []string) (map[string]bench.Op, func() error, error) {
	if len(args) != 1 {
		return nil, nil, fmt.Errorf("%s: want the namespace as the only argument", keysChildRole)
	}
	c, err := ipc.Attach(ipc.ClientOptions{Namespace: args[0], Timeout: 10 * time.Second})
	if err != nil {
		return nil, nil, err
	}
	kr, err := c.Keys().NewReader()
	if err != nil {
		c.Close()
		return nil, nil, err
	}
	keys := bench.Keys() // allocated here: separate from anything the owner stored
	buf := make([]byte, 0, bench.ValueSize)
	val := bench.Value(3)
	ops := map[string]bench.Op{
		"get": bench.GoOp(func(n int) error {
			for i := range n {
				var err error
				if buf, err = kr.Get(keys[i&(bench.NumKeys-1)], buf[:0]); err != nil {
					return err
				}
			}
			return nil
		}),
		"set": bench.GoOp(func(n int) error {
			for i := range n {
				if err := c.Keys().Set(keys[i&(bench.NumKeys-1)], val); err != nil {
					return err
				}
			}
			return nil
		}),
	}
	return ops, func() error { kr.Close(); return c.Close() }, nil
}
