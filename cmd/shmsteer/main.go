// Command shmsteer runs shmsteer's owner service, its client commands, the demo and the
// benchmarks:
//
//	shmsteer serve [flags]             the owner as a service: control API, metrics, state
//	shmsteer status                    steering and region status (attaches as a client)
//	shmsteer keys ls|rm                the key registry: ids and states, never key bytes
//	shmsteer vectors ls|show|rm        named steering vectors
//	shmsteer steer global set|clear    global steering
//	shmsteer capture fs --root DIR     the filesystem capture consumer (package capture)
//	shmsteer demo [flags]              owner + worker processes steering through one region (internal/demo)
//	shmsteer bench [flags]             comparisons with the alternatives users would pick (package bench)
//	shmsteer version | completion
//
// Exit codes: 0 ok, 1 runtime error, 2 usage error.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/shmsteer/shmsteer/bench"
	"github.com/shmsteer/shmsteer/internal/demo"
	"github.com/shmsteer/shmsteer/serve"
	"github.com/shmsteer/shmsteer/steer"
)

func main() {
	// Re-executed children take their role from the environment before any flag parsing.
	demo.RunWorkerIfRequested()
	bench.RunChildIfRequested(nil)
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

// usageError marks errors that exit with 2.
type usageError struct{ error }

func (e usageError) Unwrap() error { return e.error }

// exitCode is returned by a command group called without a subcommand (help printed, exit 2).
type exitCode int

func (e exitCode) Error() string { return fmt.Sprintf("exit %d", int(e)) }

func run(args []string, stdout, stderr io.Writer) int {
	root := newRoot(stdout, stderr)
	root.SetArgs(args)
	err := root.Execute()
	if err == nil {
		return 0
	}
	var ec exitCode
	if errors.As(err, &ec) {
		return int(ec)
	}
	fmt.Fprintln(stderr, oneprefix(err))
	var ue usageError
	if errors.As(err, &ue) {
		fmt.Fprintln(stderr, "Run 'shmsteer help' or 'shmsteer COMMAND --help' for usage.")
		return 2
	}
	return 1
}

// oneprefix words err with one "shmsteer: " prefix: the library's sentinels each carry it, so
// an error wrapped through several of them (a serve configuration error around a steering
// config error) would repeat it.
func oneprefix(err error) string {
	return "shmsteer: " + strings.ReplaceAll(err.Error(), "shmsteer: ", "")
}

// group makes a command that only holds subcommands print its help and exit 2 when called
// without one, and refuse an unknown one as a usage error.
func group(c *cobra.Command) {
	c.Args = cobra.ArbitraryArgs
	c.RunE = func(cmd *cobra.Command, a []string) error {
		if len(a) > 0 {
			return usageError{fmt.Errorf("unknown command %q for %q", a[0], cmd.CommandPath())}
		}
		cmd.Help()
		return exitCode(2)
	}
}

// version is serve.Version: the module version, or v0.0.0-dev with the VCS revision when the
// build stamped one.
func version() string { return serve.Version() }

func args(n int) cobra.PositionalArgs {
	return func(cmd *cobra.Command, a []string) error {
		if len(a) != n {
			return usageError{fmt.Errorf("%s takes %d argument(s), got %d", cmd.CommandPath(), n, len(a))}
		}
		return nil
	}
}

// cli holds what the commands share: the output streams and the client flags
// (--namespace, --secret-file) every client command binds.
type cli struct {
	stdout, stderr io.Writer
	ns, secretFile string
}

func newRoot(stdout, stderr io.Writer) *cobra.Command {
	root := &cobra.Command{
		Use:           "shmsteer",
		Short:         "Shared-memory keys and activation steering for LLM serving on one host",
		Version:       version(),
		SilenceErrors: true,
		SilenceUsage:  true,
	}
	group(root)
	root.SetOut(stdout)
	root.SetErr(stderr)
	root.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return usageError{err} })
	root.SetVersionTemplate("shmsteer {{.Version}}\n")
	c := &cli{stdout: stdout, stderr: stderr}
	versionCmd := &cobra.Command{Use: "version", Short: "Print the version", Args: args(0),
		Run: func(*cobra.Command, []string) { fmt.Fprintf(stdout, "shmsteer %s\n", version()) }}
	root.AddCommand(c.serveCmd(), c.statusCmd(), c.keysCmd(), c.vectorsCmd(), c.steerCmd(), c.demoCmd(), c.benchCmd(), c.captureCmd(), versionCmd)
	return root
}

// clientFlags binds the flags of a client command.
func (c *cli) clientFlags(fs *pflag.FlagSet) {
	fs.StringVar(&c.ns, "namespace", "default", "namespace of the owner to attach to")
	fs.StringVar(&c.secretFile, "secret-file", "", "file holding the shared secret (default: SHMSTEER_SECRET)")
}

// withClient runs f with a session attached to the owner the client flags name.
func (c *cli) withClient(f func(cs *serve.ClientSession, cmd *cobra.Command, a []string) error) func(*cobra.Command, []string) error {
	return func(cmd *cobra.Command, a []string) error {
		cs, err := serve.AttachClient(c.ns, c.secretFile)
		if err != nil {
			return err
		}
		defer cs.Close()
		return f(cs, cmd, a)
	}
}

// serveCmd is `shmsteer serve`.
func (c *cli) serveCmd() *cobra.Command {
	serveCmd := &cobra.Command{
		Use:   "serve",
		Short: "Run the owner as a service: region, control API, metrics, persisted state",
		Long: `Run the owner as a service. Configuration: defaults, then --config FILE (TOML, keys as the
flag names with '_'), then SHMSTEER_* environment variables, then flags. Prints
"listening on ADDR" once the control API accepts requests and workers can attach.
SIGTERM/SIGINT: stop accepting, answer calls in flight, persist state, exit 0. SIGHUP
re-reads --api-key-file.`,
		Args: args(0),
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg, err := serve.Load(cmd.Flags(), os.Getenv)
			if err != nil {
				if errors.Is(err, serve.ErrConfig) {
					return usageError{err}
				}
				return err
			}
			ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
			defer stop()
			return serve.Run(ctx, cfg, c.stdout, serve.NewLogger(cfg, c.stderr))
		},
	}
	serve.BindFlags(serveCmd.Flags())
	return serveCmd
}

// statusCmd is `shmsteer status`.
func (c *cli) statusCmd() *cobra.Command {
	var asJSON bool
	statusCmd := &cobra.Command{
		Use: "status", Short: "Print steering and region status (attaches as a client)", Args: args(0),
		Long: "Print steering and region status, read from the region as an attached client.\n\n" +
			"attached_clients is counted by the owner only: a client cannot see it (--json gives -1);\n" +
			"serve's GET /v1/status and its shmsteer_attached_clients metric give the owner's count.",
		RunE: c.withClient(func(cs *serve.ClientSession, cmd *cobra.Command, _ []string) error {
			return cs.PrintStatus(c.stdout, asJSON)
		}),
	}
	statusCmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	c.clientFlags(statusCmd.Flags())
	return statusCmd
}

// keysCmd is `shmsteer keys ls|rm`.
func (c *cli) keysCmd() *cobra.Command {
	keysCmd := &cobra.Command{Use: "keys", Short: "The per-request key registry (ids and states, never key bytes)"}
	keysLs := &cobra.Command{Use: "ls", Short: "List request ids and their state (live, revoked)", Args: args(0),
		RunE: c.withClient(func(cs *serve.ClientSession, _ *cobra.Command, _ []string) error { return cs.KeysList(c.stdout) })}
	keysRm := &cobra.Command{Use: "rm REQUEST_ID", Short: "Revoke a request's key (purged after the owner's grace)", Args: args(1),
		RunE: c.withClient(func(cs *serve.ClientSession, _ *cobra.Command, a []string) error {
			return cs.Keys.Remove(a[0]) // the owner's registry: mirrored with --mirror-keys
		})}
	c.clientFlags(keysLs.Flags())
	c.clientFlags(keysRm.Flags())
	keysCmd.AddCommand(keysLs, keysRm)
	group(keysCmd)
	return keysCmd
}

// vectorsCmd is `shmsteer vectors ls|show|rm|import|export`.
func (c *cli) vectorsCmd() *cobra.Command {
	vecCmd := &cobra.Command{Use: "vectors", Short: "Named steering vectors"}
	vecLs := &cobra.Command{Use: "ls", Short: "List named vectors", Args: args(0),
		RunE: c.withClient(func(cs *serve.ClientSession, _ *cobra.Command, _ []string) error { return cs.VectorsList(c.stdout) })}
	vecShow := &cobra.Command{Use: "show NAME", Short: "Show a named vector's entries", Args: args(1),
		RunE: c.withClient(func(cs *serve.ClientSession, _ *cobra.Command, a []string) error {
			return cs.VectorShow(c.stdout, a[0])
		})}
	vecRm := &cobra.Command{Use: "rm NAME", Short: "Unregister a named vector", Args: args(1),
		RunE: c.withClient(func(cs *serve.ClientSession, _ *cobra.Command, a []string) error {
			_, dropped, err := serve.UnregisterVector(cs.Engine.Engine, a[0])
			if err == nil && len(dropped) > 0 {
				fmt.Fprintf(c.stdout, "unregistered %s; its references were dropped from: %s\n", a[0], strings.Join(dropped, ", "))
			}
			return err
		})}
	var imp serve.ImportFlags
	var impName, impHint string
	vecImport := &cobra.Command{Use: "import FILE... --name NAME", Short: "Register a named vector from GGUF control vectors, .npy/.npz or safetensors files", Args: cobra.MinimumNArgs(1),
		Long: `Import steering vectors from files and register them as one named vector.

Formats: llama.cpp GGUF control vectors (direction.N is added to layer N's output: hook
post_block), .npy ([layers, hidden] or [hidden]), .npz (one array per hook) and safetensors
(tensors "<hook>.<layer>" or "layers.N"). Several files are summed, as llama.cpp sums repeated
--control-vector flags. --scale and --layers work as llama.cpp's --control-vector-scaled and
--control-vector-layer-range.`,
		RunE: c.withClient(func(cs *serve.ClientSession, cmd *cobra.Command, a []string) error {
			if impName == "" {
				return usageError{fmt.Errorf("--name is required")}
			}
			if cmd.Flags().Changed("model-hint") {
				imp.ModelHint = &impHint
			}
			return cs.VectorImport(c.stdout, impName, a, imp)
		})}
	vecImport.Flags().StringVar(&impName, "name", "", "name to register the vector under (required)")
	vecImport.Flags().Float32Var(&imp.Scale, "scale", 1, "multiply every value (llama.cpp --control-vector-scaled)")
	vecImport.Flags().StringVar(&imp.Layers, "layers", "", "keep layers A-B only, inclusive (llama.cpp --control-vector-layer-range)")
	vecImport.Flags().StringVar(&imp.Hook, "hook", "", "hook that GGUF directions and plain arrays steer (default post_block)")
	vecImport.Flags().StringVar(&imp.Format, "format", "", "gguf, npy, npz or safetensors (default: detect)")
	vecImport.Flags().Int64Var(&imp.MaxSize, "max-bytes", 0, "refuse files larger than this (default 4 GiB)")
	vecImport.Flags().StringVar(&impHint, "model-hint", "", "model hint stored with the vector (default: the GGUF's controlvector.model_hint)")
	var expFormat, expHook, expHint string
	vecExport := &cobra.Command{Use: "export NAME FILE", Short: "Write a named vector to a GGUF, .npy, .npz or safetensors file", Args: args(2),
		RunE: c.withClient(func(cs *serve.ClientSession, cmd *cobra.Command, a []string) error {
			var hint *string // the stored hint unless --model-hint is given
			if cmd.Flags().Changed("model-hint") {
				hint = &expHint
			}
			return cs.VectorExport(c.stdout, a[0], a[1], expFormat, expHook, hint)
		})}
	vecExport.Flags().StringVar(&expFormat, "format", "", "gguf, npy, npz or safetensors (default: from the extension)")
	vecExport.Flags().StringVar(&expHook, "hook", "", "the hook a GGUF file's directions are taken from (default post_block)")
	vecExport.Flags().StringVar(&expHint, "model-hint", "", "GGUF controlvector.model_hint to write (default: the one stored with the vector; \"\" for none)")
	for _, sub := range []*cobra.Command{vecLs, vecShow, vecRm, vecImport, vecExport} {
		c.clientFlags(sub.Flags())
	}
	vecCmd.AddCommand(vecLs, vecShow, vecRm, vecImport, vecExport)
	group(vecCmd)
	return vecCmd
}

// steerCmd is `shmsteer steer global set|clear`.
func (c *cli) steerCmd() *cobra.Command {
	steerCmd := &cobra.Command{Use: "steer", Short: "Steering state"}
	globalCmd := &cobra.Command{Use: "global", Short: "Global steering tiers"}
	var file string
	var refs []string
	var replace bool
	globalSet := &cobra.Command{Use: "set", Short: "Set global steering (merged per site unless --replace)", Args: args(0),
		Long: `Set global steering from --file (JSON in the POST /v1/steering/set format, "-" for stdin)
and/or --ref NAME[=STRENGTH] (a registered named vector in the base tier).`,
		RunE: c.withClient(func(cs *serve.ClientSession, _ *cobra.Command, _ []string) error {
			if file == "" && len(refs) == 0 {
				return usageError{errors.New("steer global set needs --file or --ref")}
			}
			v, err := cs.GlobalSet(file, refs, replace)
			if err == nil {
				fmt.Fprintf(c.stdout, "global steering set at version %d\n", v)
			}
			return err
		})}
	globalSet.Flags().StringVar(&file, "file", "", "JSON file in the /v1/steering/set format (- for stdin)")
	globalSet.Flags().StringArrayVar(&refs, "ref", nil, "named vector to apply in the base tier, NAME[=STRENGTH] (repeatable)")
	globalSet.Flags().BoolVar(&replace, "replace", false, "replace all global steering instead of merging")
	globalClear := &cobra.Command{Use: "clear", Short: "Clear global steering", Args: args(0),
		RunE: c.withClient(func(cs *serve.ClientSession, _ *cobra.Command, _ []string) error {
			v, err := cs.Engine.SetGlobal(steer.Steering{})
			if err == nil {
				fmt.Fprintf(c.stdout, "global steering cleared at version %d\n", v)
			}
			return err
		})}
	c.clientFlags(globalSet.Flags())
	c.clientFlags(globalClear.Flags())
	globalCmd.AddCommand(globalSet, globalClear)
	steerCmd.AddCommand(globalCmd)
	group(globalCmd)
	group(steerCmd)
	return steerCmd
}

// demoCmd is `shmsteer demo`: internal/demo with its flags.
func (c *cli) demoCmd() *cobra.Command {
	var demoOpts *demo.Options
	demoCmd := &cobra.Command{Use: "demo", Short: "Run the demo: an owner and worker processes steering through one region", Args: args(0),
		RunE: func(*cobra.Command, []string) error {
			return usageIf(demo.Main(*demoOpts, c.stdout, c.stderr), demo.ErrUsage)
		}}
	demoOpts = demo.BindFlags(demoCmd.Flags())
	return demoCmd
}

// benchCmd is `shmsteer bench`: package bench with its flags.
func (c *cli) benchCmd() *cobra.Command {
	var benchOpts *bench.Options
	benchCmd := &cobra.Command{Use: "bench", Short: "Run the benchmarks against the alternatives", Args: args(0),
		Long: `Run the benchmarks: shmsteer against what users would pick instead, contenders alternating
round by round, medians reported. The table goes to c.stdout, progress to c.stderr; a figure
that cannot run here is reported as skipped with the reason.`,
		RunE: func(*cobra.Command, []string) error {
			return usageIf(bench.Main(*benchOpts, c.stdout, c.stderr), bench.ErrUsage)
		}}
	benchOpts = bench.BindFlags(benchCmd.Flags())
	return benchCmd
}

// usageIf makes err a usage error (exit 2) when it wraps sentinel.
func usageIf(err, sentinel error) error {
	if errors.Is(err, sentinel) {
		return usageError{err}
	}
	return err
}
