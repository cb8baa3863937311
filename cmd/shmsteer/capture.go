package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/shmsteer/shmsteer/capture"
	"github.com/shmsteer/shmsteer/ipc"
	"github.com/shmsteer/shmsteer/steer"
)

// captureCmd is `shmsteer capture fs`.
func (c *cli) captureCmd() *cobra.Command {
	captureCmd := &cobra.Command{Use: "capture", Short: "Activation capture consumers"}
	group(captureCmd)
	var root, layout, name, policy string
	var fsync, follow bool
	var bound time.Duration
	fsCmd := &cobra.Command{
		Use:   "fs --root DIR",
		Short: "The filesystem consumer: write captured requests under DIR in the fork's layout",
		Long: `Attach to the owner as a capture consumer (a name the owner declares, --name) and write
each captured request under {root}/{tag}/{request_id}/ in the RhizoNymph fork's layout:
per_file ({layer}_{hook}.bin and .json sidecars) or packed (packed.bin and packed.json),
the request's spec choosing and --layout the default. At the request's end it publishes
the paths it wrote (GET /v1/requests/{id}/capture). Prints "capture fs: attached" once
attached. At start it removes the .tmp files a killed consumer left under DIR. When the
owner restarts or drops it, it attaches again (--follow=false: it exits 0). SIGTERM/SIGINT:
stop, exit 0 (requests not ended are abandoned, .tmp files removed).`,
		Args: args(0),
		RunE: func(cmd *cobra.Command, _ []string) error {
			if root == "" {
				return usageError{errors.New("capture fs needs --root DIR")}
			}
			l, err := capture.ParseLayout(layout)
			if err != nil {
				return usageError{err}
			}
			var p capture.Policy
			switch policy {
			case "block":
				p = capture.Block
			case "drop":
				p = capture.Drop
			default:
				return usageError{fmt.Errorf("--policy %q: want block or drop", policy)}
			}
			if err := os.MkdirAll(root, 0o755); err != nil {
				return fmt.Errorf("%w: --root: %v", capture.ErrWrite, err)
			}
			// What a consumer killed mid-request left unpublished.
			if n, err := capture.RemoveStaleTemps(root); err != nil {
				return err
			} else if n > 0 {
				fmt.Fprintf(c.stdout, "capture fs: removed %d stale .tmp files under %s\n", n, root)
			}
			ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
			defer stop()
			var st capture.FSStats
			copts := capture.ConsumerOptions{Name: name, Policy: p, Bound: bound}
			attached := "attached"
			run := func(cons *capture.Consumer, cl *ipc.Client) error {
				cfg, err := steer.ConfigOf(cl.Region())
				if err != nil {
					return err
				}
				fmt.Fprintf(c.stdout, "capture fs: %s as consumer %q to namespace %q, writing under %s\n", attached, name, c.ns, root)
				attached = "attached again"
				return capture.RunFilesystem(ctx, cons, capture.FSConsumerOptions{Root: root, Layout: l, FS: capture.FSOptions{NoFsync: !fsync}, Config: cfg,
					Logf: func(format string, a ...any) { fmt.Fprintf(c.stderr, "shmsteer: "+format+"\n", a...) }}, &st)
			}
			clientOpts := ipc.ClientOptions{Namespace: c.ns, SecretFile: c.secretFile, DropEnv: true}
			if follow {
				err = capture.Follow(ctx, capture.FollowOptions{Client: clientOpts, Consumer: copts,
					Logf: func(format string, a ...any) { fmt.Fprintf(c.stdout, "capture fs: "+format+"\n", a...) }}, run)
			} else {
				err = attachOnce(clientOpts, copts, run)
			}
			fmt.Fprintf(c.stdout, "capture fs: %d requests (%d ok, %d partial, %d failed), %d records, %d bytes\n", st.Requests, st.OK, st.Partial, st.Failed, st.Records, st.Bytes)
			switch {
			case errors.Is(err, context.Canceled):
				return nil
			case errors.Is(err, capture.ErrHubGone):
				// The owner stopped (or dropped this consumer): the end of the work, not an
				// error of this process.
				fmt.Fprintf(c.stdout, "capture fs: the owner closed its capture connection (it stopped, or dropped this consumer); exiting (--follow attaches again)\n")
				return nil
			}
			return err
		},
	}
	f := fsCmd.Flags()
	f.StringVar(&root, "root", "", "directory the capture files go under")
	f.StringVar(&layout, "layout", "per_file", "layout for specs that name none: per_file or packed")
	f.BoolVar(&fsync, "fsync", true, "fsync each file and its directory before publishing it")
	f.StringVar(&name, "name", "fs", "consumer name (one the owner declares)")
	f.StringVar(&policy, "policy", "block", "backpressure: block (workers wait up to --bound, then drop) or drop")
	f.DurationVar(&bound, "bound", 0, "longest a worker's append waits for this consumer (block; 0: the worker's)")
	f.BoolVar(&follow, "follow", true, "attach again when the owner restarts or drops this consumer (as workers follow serve); false: exit")
	c.clientFlags(f)
	captureCmd.AddCommand(fsCmd)
	return captureCmd
}

// attachOnce attaches a consumer and runs run with it once (capture fs --follow=false).
func attachOnce(clientOpts ipc.ClientOptions, copts capture.ConsumerOptions, run func(*capture.Consumer, *ipc.Client) error) error {
	cl, err := ipc.Attach(clientOpts)
	if err != nil {
		return err
	}
	defer cl.Close()
	cons, err := capture.NewConsumer(cl, copts)
	if err != nil {
		return err
	}
	defer cons.Close()
	return run(cons, cl)
}
