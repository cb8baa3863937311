package main

// shmsteer_capture_fs_t: the filesystem consumer (package capture's RunFilesystem, what
// `shmsteer capture fs` runs) on goroutines of this process, for hosts that ship the library
// and not the command (the Python package, the vLLM plugin's engine process).

/*
#include <stdint.h>
#include <stdlib.h>
#include "shmsteer.h"
*/
import "C"

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"
	"unsafe"

	"github.com/shmsteer/shmsteer/capture"
	"github.com/shmsteer/shmsteer/ipc"
	"github.com/shmsteer/shmsteer/steer"
)

// fsConsumer is what a shmsteer_capture_fs_t stands for: capture.Follow running
// capture.RunFilesystem on a goroutine until stopped. stats and err are the goroutine's until
// done is closed.
type fsConsumer struct {
	cancel context.CancelFunc
	done   chan struct{}
	stats  capture.FSStats
	err    error
}

// fsOptions reads shmsteer_capture_fs_options: the consumer's attach options and the root and
// layout RunFilesystem writes with.
func fsOptions(opt *C.shmsteer_capture_fs_options) (capture.ConsumerOptions, capture.FSConsumerOptions, error) {
	root := goString(opt.root)
	if root == "" {
		return capture.ConsumerOptions{}, capture.FSConsumerOptions{}, fmt.Errorf("%w: root must name a directory", ErrInvalidArgument)
	}
	name := goString(opt.name)
	if name == "" {
		name = "fs"
	}
	layout := capture.LayoutPerFile
	if opt.layout != nil {
		l, err := capture.ParseLayout(C.GoString(opt.layout))
		if err != nil {
			return capture.ConsumerOptions{}, capture.FSConsumerOptions{}, err
		}
		layout = l
	}
	if opt.bound_ns < 0 {
		return capture.ConsumerOptions{}, capture.FSConsumerOptions{}, fmt.Errorf("%w: bound_ns %d", capture.ErrBadPolicy, int64(opt.bound_ns))
	}
	copts := capture.ConsumerOptions{Name: name, Policy: capture.Policy(opt.policy), Bound: time.Duration(opt.bound_ns)}
	return copts, capture.FSConsumerOptions{Root: root, Layout: layout, FS: capture.FSOptions{NoFsync: opt.fsync == 0}}, nil
}

//export shmsteerGo_capture_fs_start
func shmsteerGo_capture_fs_start(ns *C.char, secret unsafe.Pointer, secretLen C.size_t, secretFile *C.char, opt *C.shmsteer_capture_fs_options, out *C.uint64_t) C.int {
	if out == nil || opt == nil {
		return badArg("opt and out must not be NULL")
	}
	copts, fopts, err := fsOptions(opt)
	if err != nil {
		return fail(err)
	}
	sec, err := resolveSecret(secret, secretLen, secretFile)
	if err != nil {
		return fail(err)
	}
	if err := os.MkdirAll(fopts.Root, 0o755); err != nil {
		return fail(fmt.Errorf("%w: root: %v", capture.ErrWrite, err))
	}
	// What a consumer killed mid-request left unpublished.
	if _, err := capture.RemoveStaleTemps(fopts.Root); err != nil {
		return fail(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	f := &fsConsumer{cancel: cancel, done: make(chan struct{})}
	attached := make(chan struct{})
	go func() {
		defer close(f.done)
		first := true
		f.err = capture.Follow(ctx, capture.FollowOptions{Client: ipc.ClientOptions{Secret: sec, Namespace: goString(ns)}, Consumer: copts, Logf: quietLogf},
			func(c *capture.Consumer, cl *ipc.Client) error {
				cfg, err := steer.ConfigOf(cl.Region())
				if err != nil {
					return err
				}
				if first {
					first = false
					close(attached)
				}
				o := fopts
				o.Config, o.Logf = cfg, quietLogf
				return capture.RunFilesystem(ctx, c, o, &f.stats)
			})
	}()
	select {
	case <-attached:
	case <-f.done:
		select {
		case <-attached: // attached, then failed: stop reports why
		default: // the first attach failed
			cancel()
			return fail(f.err)
		}
	}
	rc := store(f, out)
	if rc != C.SHMSTEER_OK {
		cancel()
		<-f.done
	}
	return rc
}

// quietLogf logs the consumer's per-request failures and follow events as warnings.
func quietLogf(format string, a ...any) { quietLogger().Warn(fmt.Sprintf(format, a...)) }

//export shmsteerGo_capture_fs_stop
func shmsteerGo_capture_fs_stop(h C.uint64_t, st *C.shmsteer_capture_fs_stats) C.int {
	f, ok := getAs[*fsConsumer](uint64(h))
	if !ok || !handles.remove(uint64(h)) {
		return badHandle("not a live shmsteer_capture_fs_t")
	}
	f.cancel()
	<-f.done
	if st != nil {
		s := f.stats
		*st = C.shmsteer_capture_fs_stats{requests: C.uint64_t(s.Requests), ok: C.uint64_t(s.OK), partial: C.uint64_t(s.Partial),
			failed: C.uint64_t(s.Failed), records: C.uint64_t(s.Records), bytes: C.uint64_t(s.Bytes)}
	}
	if f.err != nil && !errors.Is(f.err, context.Canceled) {
		return fail(f.err)
	}
	return C.SHMSTEER_OK
}
