//go:build linux

package capture

import (
	"context"
	"errors"
	"time"

	"github.com/shmsteer/shmsteer/ipc"
)

// FollowOptions configure Follow.
type FollowOptions struct {
	// Client configures each attach to the owner (ipc.Follow: the secret is resolved once and
	// kept for re-attaching).
	Client ipc.ClientOptions
	// Consumer is the consumer's name, policy and bound (its Namespace, Secret and SecretFile
	// are not used: Client's are).
	Consumer ConsumerOptions
	// Retry is the wait between attempts to attach again; 0 means 200 ms.
	Retry time.Duration
	// Logf receives the follower's events (the hub gone, attached again); nil: none.
	Logf func(format string, args ...any)
}

// Follow runs run with a consumer attached as opts say and, each time the owner's capture hub
// goes (run returns ErrHubGone: the owner stopped, restarted, or dropped this consumer for not
// reading its notices), attaches again and runs run with the new consumer, as workers follow
// the owner (ipc.Follow), until ctx ends (it returns ctx's error) or run returns another
// error. The first attach fails at once as NewConsumer does; later, the owner's absence is
// waited out, retrying every opts.Retry, but a consumer the owner no longer declares
// (ErrUnknownConsumer), a bad policy or a secret the owner refuses ends it. run gets the
// consumer and the client it attached through (the owner's region: its model config); each
// consumer is closed when run returns. Requests in flight when the hub went are the old
// hub's: the owner ended them with status error, and run's next consumer is not told of them.
func Follow(ctx context.Context, opts FollowOptions, run func(*Consumer, *ipc.Client) error) error {
	logf := opts.Logf
	if logf == nil {
		logf = func(string, ...any) {}
	}
	retry := opts.Retry
	if retry <= 0 {
		retry = 200 * time.Millisecond
	}
	f, err := ipc.Follow(ipc.FollowOptions{Client: opts.Client})
	if err != nil {
		return err
	}
	defer f.Close()
	waiting := false
	for first := true; ; first = false {
		cl := f.Client()
		c, err := NewConsumer(cl, opts.Consumer)
		if err != nil {
			if first || !followRetries(err) {
				return err
			}
			if !waiting {
				// Not the error's text: an operator reads "gone" or "refused" as a failure of
				// this process, and the owner's absence is what Follow waits out.
				logf("capture consumer %q: waiting for the owner to serve capture again", opts.Consumer.Name)
				waiting = true
			}
			t := time.NewTimer(retry)
			select {
			case <-ctx.Done():
				t.Stop()
				return ctx.Err()
			case <-t.C:
			}
			continue
		}
		if !first {
			logf("capture consumer %q: attached again to the owner's capture hub", opts.Consumer.Name)
		}
		waiting = false
		err = run(c, cl)
		c.Close()
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if !errors.Is(err, ErrHubGone) {
			return err
		}
		logf("capture consumer %q: the owner's capture hub closed the connection (the owner stopped, restarted or dropped this consumer): attaching again", opts.Consumer.Name)
	}
}

// followRetries says whether Follow waits out a failed attach: the owner absent, busy or
// restarting, its hub not serving yet, the consumer's old connection not yet gone.
func followRetries(err error) bool {
	for _, fatal := range []error{ErrUnknownConsumer, ErrBadPolicy, ErrBadConsumer, ipc.ErrAuthFailed, ipc.ErrSecretFile, ipc.ErrAuthSecretNotDefined} {
		if errors.Is(err, fatal) {
			return false
		}
	}
	return true
}
