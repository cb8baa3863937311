//go:build linux

package capture

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/shmsteer/shmsteer/steer"
)

// FSConsumerOptions configure RunFilesystem.
type FSConsumerOptions struct {
	Root   string    // the directory the files go under: {root}/{tag}/{request_id}/
	Layout Layout    // for specs that name none; LayoutDefault means per_file
	FS     FSOptions // fsync or not
	Config steer.ModelConfig
	// Logf receives per-request failures (default: none).
	Logf func(format string, args ...any)
}

// FSStats are the filesystem consumer's counters.
type FSStats struct {
	Requests, OK, Partial, Failed uint64
	Records, Bytes                uint64
}

// noRows is the error of a request whose spec selects prompt rows and of which no record came.
const noRows = "shmsteer: no rows were captured for the request although its spec selects prompt rows: no worker captured its steps " +
	"(a worker registers its ring with capture.RegisterWorker and captures with Stepper.SetCapture; Python: SteeringHooks.start_capture)"

// fsRequest is a request RunFilesystem writes.
type fsRequest struct {
	files *RequestFiles
	err   error
	rows  bool // the plan selects prompt rows: a request with none was not captured
}

// result finishes the request (dropped records of it were dropped for the consumer) and says
// how it went.
func (o *fsRequest) result(dropped uint64) Result {
	switch {
	case o.err != nil:
		return Result{Status: StatusError, Error: o.err.Error()}
	case o.files.Empty() && o.rows && dropped == 0:
		// Its spec selects prompt rows, yet no worker captured any of them.
		o.files.Abort()
		return Result{Status: StatusError, Error: noRows}
	}
	paths, err := o.files.Finish()
	if err != nil {
		return Result{Status: StatusError, Error: err.Error()}
	}
	res := Result{Status: StatusOK}
	res.Payload, _ = json.Marshal(append([]string{}, paths...)) // [] rather than null
	if dropped > 0 {
		res.Status = StatusPartialError
		res.Error = fmt.Sprintf("shmsteer: %d capture records were dropped while the request ran (the consumer lagged; raise its bound or the ring's capacity)", dropped)
	}
	return res
}

// RunFilesystem is the filesystem consumer: it reads c until ctx ends or the hub goes,
// writing each captured request with RequestFiles (the fork's layout) and publishing the
// paths it wrote as the request's payload at its end: ok, partial_error when records were
// dropped for it (the files hold what arrived), error when its spec does not resolve, its
// directory exists already (OpenRequest), a write fails, or its spec selects prompt rows and
// none came (no worker captured it). It returns ctx's error, or the hub's or a ring's.
func RunFilesystem(ctx context.Context, c *Consumer, opts FSConsumerOptions, stats *FSStats) error {
	if stats == nil {
		stats = &FSStats{}
	}
	if opts.Layout == LayoutDefault {
		opts.Layout = LayoutPerFile
	}
	logf := opts.Logf
	if logf == nil {
		logf = func(string, ...any) {}
	}
	reqs := map[string]*fsRequest{}
	defer func() {
		for _, o := range reqs {
			if o.files != nil {
				o.files.Abort()
			}
		}
	}()
	for ctx.Err() == nil {
		ev, ok, err := c.Next(100 * time.Millisecond)
		if err != nil {
			return err
		}
		if !ok {
			continue
		}
		switch ev.Kind {
		case EventBegin:
			if o := reqs[ev.RequestID]; o != nil && o.files != nil {
				o.files.Abort()
			}
			o := &fsRequest{}
			reqs[ev.RequestID] = o
			stats.Requests++
			spec, err := DecodeFilesystemSpec(ev.Spec)
			if err != nil {
				o.err = err
				continue
			}
			plan, err := spec.Resolve(opts.Config, ev.PromptLen)
			if err != nil {
				o.err = err
				continue
			}
			o.rows = plan.Positions.Kind != PosAllGenerated
			o.files, o.err = OpenRequest(opts.Root, ev.RequestID, plan, opts.Layout, opts.FS)
		case EventRecord:
			o := reqs[ev.RequestID]
			if o == nil || o.err != nil {
				continue
			}
			if err := o.files.Append(ev.Record.Record); err != nil {
				o.err = err
				if !errors.Is(err, ErrWrite) {
					o.files.Abort()
				}
				o.files = nil
				continue
			}
			stats.Records++
			stats.Bytes += uint64(len(ev.Record.Data))
		case EventEnd:
			o := reqs[ev.RequestID]
			delete(reqs, ev.RequestID)
			if o == nil {
				continue
			}
			res := o.result(ev.Dropped)
			switch res.Status {
			case StatusOK:
				stats.OK++
			case StatusPartialError:
				stats.Partial++
			default:
				stats.Failed++
				logf("capture request %q: %s", ev.RequestID, res.Error)
			}
			if err := c.Publish(ev.RequestID, res); err != nil {
				return err
			}
		}
	}
	return ctx.Err()
}
