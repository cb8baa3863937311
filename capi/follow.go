package main

/*
#include <stdint.h>
#include "shmsteer.h"
*/
import "C"

import (
	"sync"
	"time"
	"unsafe"

	"github.com/shmsteer/shmsteer/internal/proto"
	"github.com/shmsteer/shmsteer/ipc"
	"github.com/shmsteer/shmsteer/keys"
	"github.com/shmsteer/shmsteer/steer"
)

// A shmsteer_follower_t is an ipc.Follower: a client that follows the owner of its namespace
// across owner restarts, with the readiness check Go workers use (FollowOptions.Ready). C and
// Python take the current client's shmsteer_t at each unit of work (a step); the follower owns
// those handles and closes them with itself.
type follower struct {
	f *ipc.Follower

	mu    sync.Mutex
	gen   uint64               // the generation cur stands for
	cur   uint64               // handle of the current client's instance
	insts map[uint64]*instance // every instance handed out, by handle, for Close
}

// clientInstance is the instance of an attached client.
func clientInstance(c *ipc.Client) *instance {
	inst := &instance{side: clientSide{c}, region: c.Region(), ownerPD: c.OwnerPID()}
	if kw, err := keys.Attach(c); err != nil {
		inst.keysErr = err
	} else {
		inst.keys = kw.Registry
	}
	w, err := steer.Attach(c.Region(), nil, steer.Options{Caller: c, Logf: func(string, ...any) {}})
	if err != nil {
		inst.engErr = err
	} else {
		inst.eng, inst.cfg = w.Engine, w.Config()
	}
	return inst
}

// serveReady is serve.IsReady without importing serve: the marker serve publishes once its
// persisted state is restored.
func serveReady(c *ipc.Client) bool {
	_, err := c.Region().Get(proto.KindServe, "ready", nil)
	return err == nil
}

//export shmsteerGo_follow
func shmsteerGo_follow(ns *C.char, secret unsafe.Pointer, secretLen C.size_t, secretFile *C.char, timeoutMs, pollMs C.int64_t, flags C.uint32_t, out *C.uint64_t) C.int {
	if out == nil || timeoutMs < 0 || pollMs < 0 || flags&^C.SHMSTEER_FOLLOW_READY_SERVE != 0 {
		return badArg("out must not be NULL, timeout_ms and poll_ms not negative, flags SHMSTEER_FOLLOW_*")
	}
	sec, err := resolveSecret(secret, secretLen, secretFile)
	if err != nil {
		return fail(err)
	}
	opts := ipc.FollowOptions{
		Client: ipc.ClientOptions{Secret: sec, Namespace: goString(ns), Timeout: time.Duration(timeoutMs) * time.Millisecond},
		Poll:   time.Duration(pollMs) * time.Millisecond,
	}
	if opts.Poll > 0 {
		opts.MinBackoff, opts.MaxBackoff = opts.Poll/4, 4*opts.Poll
	}
	if flags&C.SHMSTEER_FOLLOW_READY_SERVE != 0 {
		opts.Ready = serveReady
	}
	f, err := ipc.Follow(opts)
	if err != nil {
		return fail(err)
	}
	fo := &follower{f: f, insts: map[uint64]*instance{}}
	rc := store(fo, out)
	if rc != C.SHMSTEER_OK {
		f.Close()
	}
	return rc
}

func followerOf(h C.uint64_t) (*follower, C.int) {
	fo, ok := getAs[*follower](uint64(h))
	if !ok {
		return nil, badHandle("not a live shmsteer_follower_t")
	}
	return fo, C.SHMSTEER_OK
}

//export shmsteerGo_follower_client
func shmsteerGo_follower_client(h C.uint64_t, client, generation *C.uint64_t, dead *C.int) C.int {
	fo, rc := followerOf(h)
	if rc != C.SHMSTEER_OK {
		return rc
	}
	if client == nil {
		return badArg("client must not be NULL")
	}
	fo.mu.Lock()
	defer fo.mu.Unlock()
	// Generation first: a client read after it is at least as new, so a step never pairs a
	// new generation with the old region.
	gen, isDead := fo.f.Generation(), fo.f.Dead()
	if fo.cur == 0 || gen != fo.gen {
		inst := clientInstance(fo.f.Client())
		var hv C.uint64_t
		if rc := store(inst, &hv); rc != C.SHMSTEER_OK {
			return rc
		}
		fo.cur, fo.gen = uint64(hv), gen
		fo.insts[fo.cur] = inst
	}
	*client = C.uint64_t(fo.cur)
	if generation != nil {
		*generation = C.uint64_t(fo.gen)
	}
	if dead != nil {
		*dead = 0
		if isDead {
			*dead = 1
		}
	}
	return C.SHMSTEER_OK
}

//export shmsteerGo_follower_close
func shmsteerGo_follower_close(h C.uint64_t) C.int {
	fo, ok := getAs[*follower](uint64(h))
	if !ok || !handles.remove(uint64(h)) {
		return badHandle("shmsteer_follower_close")
	}
	fo.mu.Lock()
	for hv, inst := range fo.insts {
		handles.remove(hv) // the follower closes their clients, and their readers first
		inst.readers.closeAll()
	}
	fo.insts = nil
	fo.mu.Unlock()
	if err := fo.f.Close(); err != nil {
		return fail(err)
	}
	return C.SHMSTEER_OK
}
