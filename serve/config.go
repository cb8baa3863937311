package serve

import (
	"errors"
	"fmt"
	"net/url"
	"os"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/shmsteer/shmsteer/capture"

	"github.com/BurntSushi/toml"
	"github.com/spf13/pflag"

	"github.com/shmsteer/shmsteer/steer"
)

var (
	// ErrConfig means a configuration value (file, environment or flag) is missing or out of
	// range; the message names it.
	ErrConfig = errors.New("shmsteer: bad serve configuration")
	// ErrStateCorrupt means the state file fails its checksum or cannot be decoded; move it
	// away to start empty, or restore a backup.
	ErrStateCorrupt = errors.New("shmsteer: state file corrupt")
	// ErrStateIncompatible means the state file was written by another format version or for
	// another model config; start with the config it was written for, or another --state-dir.
	ErrStateIncompatible = errors.New("shmsteer: state file incompatible")
	// ErrStateLocked means another serve process uses the state directory.
	ErrStateLocked = errors.New("shmsteer: state directory in use by another process")
	// ErrStateUnsafe means the state directory, or something in it, belongs to another uid, is
	// writable by group or others, or is not a plain file or directory: serve restores what is
	// there, so it refuses it; the message names the path and the fix.
	ErrStateUnsafe = errors.New("shmsteer: state directory not private to serve's uid")
)

// Config is the configuration of `shmsteer serve`. The toml tag names the TOML key, the
// SHMSTEER_ variable (upper-cased) and the flag ('-' for '_').
type Config struct {
	Namespace string   `toml:"namespace" help:"namespace of the region (workers attach with the same)"`
	Hidden    int      `toml:"hidden" help:"model hidden size (length of every steering vector)"`
	Layers    int      `toml:"layers" help:"number of model layers"`
	Hooks     []string `toml:"hooks" help:"hook names, in order (default pre_attn,post_attn,post_block,mlp_in,mlp_out)"`

	IndexSlots  int   `toml:"index_slots" help:"region index slots (power of two)"`
	ArenaBytes  int64 `toml:"arena_bytes" help:"region arena size in bytes"`
	ReaderSlots int   `toml:"reader_slots" help:"region reader slots shared by all processes"`
	Columns     int   `toml:"columns" help:"region column pool: requests admitted at once whose own vectors are laid out site by site for fast decode steps (0: 256; negative: none; more are stored in their entries; at most what the pool holds for the model, steer.MaxColumns: more is refused at start)"`

	MaxConversations int           `toml:"max_conversations" help:"latch cap: conversations"`
	MaxLatchedBytes  int64         `toml:"max_latched_bytes" help:"latch cap: bytes held by value"`
	LatchPolicy      string        `toml:"latch_policy" help:"latch eviction policy: fifo or lru"`
	Grace            time.Duration `toml:"grace" help:"how long a removed key's revoked sentinel stands"`
	Spin             time.Duration `toml:"spin" help:"owner RPC spin wait (negative: off)"`

	HTTP            string        `toml:"http" help:"control API address: host:port or unix:PATH"`
	APIKeyFile      string        `toml:"api_key_file" help:"file of API keys, one per line, optionally tenant:key"`
	Auth            string        `toml:"auth" help:"control API auth: keys (every /v1/ call needs a key) or fork (as the vLLM fork: open without keys; with keys, set, clear, modules and admissions need one, reads and the vector registry do not; callers without a key run unscoped there, so fork refuses tenant:key lines at start and on SIGHUP)"`
	StateDir        string        `toml:"state_dir" help:"directory where state survives restarts (empty: none)"`
	SecretFile      string        `toml:"secret_file" help:"file holding the shared secret (default: SHMSTEER_SECRET)"`
	MaxBodyBytes    int64         `toml:"max_body_bytes" help:"largest request body accepted"`
	MaxUploadBytes  int64         `toml:"max_upload_bytes" help:"largest vector file accepted by POST /v1/steering/vectors/import"`
	PersistInterval time.Duration `toml:"persist_interval" help:"how soon latch changes from admissions are persisted"`
	LogFormat       string        `toml:"log_format" help:"log format: text or json"`
	LogLevel        string        `toml:"log_level" help:"log level: debug, info, warn or error"`

	// Bounds on what HTTP clients can make serve hold (limits.go).
	MaxInflightBodyBytes int64         `toml:"max_inflight_body_bytes" help:"request body bytes serve reads at once, all requests together (beyond each body's first 64 KiB); more gets 503"`
	MaxTenantBodyBytes   int64         `toml:"max_tenant_body_bytes" help:"request body bytes serve reads at once for one tenant's keys (the admin keys: max_inflight_body_bytes only)"`
	MaxConnections       int           `toml:"max_connections" help:"HTTP connections open at once (lowered to leave 256 file descriptors for workers and state); when full, the longest-idle one is closed"`
	ReadTimeout          time.Duration `toml:"read_timeout" help:"longest time to read one request, headers and body"`
	IdleTimeout          time.Duration `toml:"idle_timeout" help:"how long a keep-alive connection may wait for its next request"`

	// Per-tenant quotas (quota.go): what one tenant's conversations and keys may hold.
	TenantMaxLatches      int   `toml:"tenant_max_latches" help:"latched conversations per tenant (a tenant at its cap evicts its own oldest)"`
	TenantMaxLatchedBytes int64 `toml:"tenant_max_latched_bytes" help:"bytes held by value in one tenant's latches"`
	TenantMaxVectors      int   `toml:"tenant_max_vectors" help:"named vectors (steer and probe) a tenant's keys may hold"`
	TenantMaxVectorBytes  int64 `toml:"tenant_max_vector_bytes" help:"bytes of named vector encodings a tenant's keys may hold"`
	TenantMaxCaptureBytes int64 `toml:"tenant_max_capture_bytes" help:"bytes of capture specs a tenant's admitted, not yet ended requests may hold"`

	Mirror       string `toml:"mirror" help:"NATS server(s) to mirror steering state through with other hosts, nats://HOST:PORT[,...] (empty: no mirror)"`
	MirrorBucket string `toml:"mirror_bucket" help:"JetStream key-value bucket of the mirror, the same on every host (empty: shmsteer)"`
	MirrorCreds  string `toml:"mirror_creds" help:"NATS credentials file (JWT and nkey seed) for the mirror"`
	MirrorKeys   bool   `toml:"mirror_keys" help:"mirror the per-request keys too (sealed with a key derived from the secret)"`
	HostID       string `toml:"host_id" help:"this host's id in the mirror, distinct per host (empty: the hostname)"`

	// CaptureConsumers are the activation-capture consumers the owner declares (issue 24).
	CaptureConsumers []string `toml:"capture_consumer" help:"a capture consumer admissions may name, NAME=TYPE (type: filesystem); repeat or comma-separate for several"`
	// CaptureGlobal are declared consumers' global specs: every request that does not name the
	// consumer is captured with it (a request's own spec replaces it).
	CaptureGlobal []string `toml:"capture_global" help:"a declared capture consumer's global spec, applied to every request that does not name it: NAME=@FILE, FILE a JSON spec (filesystem: tag, hooks, positions, layout; each request is written under its own id); repeat or comma-separate for several"`
}

// DefaultConfig is the configuration before the file, environment and flags.
func DefaultConfig() Config {
	return Config{
		Namespace: "default", Hidden: 4096, Layers: 32,
		IndexSlots: 1 << 16, ArenaBytes: 1 << 30, ReaderSlots: 256,
		MaxConversations: steer.DefaultMaxConversations, MaxLatchedBytes: steer.DefaultMaxLatchedBytes,
		LatchPolicy: "fifo", Grace: 60 * time.Second,
		HTTP: "127.0.0.1:8677", Auth: AuthKeys, MaxBodyBytes: 64 << 20, MaxUploadBytes: 256 << 20, PersistInterval: time.Second,
		MaxInflightBodyBytes: 256 << 20, MaxTenantBodyBytes: 128 << 20, MaxConnections: 1024,
		ReadTimeout: time.Minute, IdleTimeout: time.Minute,
		TenantMaxLatches: steer.DefaultMaxConversations / 4, TenantMaxLatchedBytes: steer.DefaultMaxLatchedBytes / 4,
		TenantMaxVectors: 256, TenantMaxVectorBytes: 64 << 20, TenantMaxCaptureBytes: 16 << 20,
		LogFormat: "text", LogLevel: "info",
	}
}

type field struct {
	key, help string
	v         reflect.Value
}

func (c *Config) fields() []field {
	rv := reflect.ValueOf(c).Elem()
	var out []field
	for i := range rv.NumField() {
		f := rv.Type().Field(i)
		out = append(out, field{key: f.Tag.Get("toml"), help: f.Tag.Get("help"), v: rv.Field(i)})
	}
	return out
}

func flagName(key string) string { return strings.ReplaceAll(key, "_", "-") }

// BindFlags defines serve's flags (and --config) on fs; Load reads them back.
func BindFlags(fs *pflag.FlagSet) {
	def := DefaultConfig()
	fs.String("config", "", "TOML configuration file")
	for _, f := range def.fields() {
		name := flagName(f.key)
		switch p := f.v.Addr().Interface().(type) {
		case *string:
			fs.String(name, *p, f.help)
		case *int:
			fs.Int(name, *p, f.help)
		case *int64:
			fs.Int64(name, *p, f.help)
		case *time.Duration:
			fs.Duration(name, *p, f.help)
		case *[]string:
			fs.StringSlice(name, *p, f.help)
		case *bool:
			fs.Bool(name, *p, f.help)
		}
	}
}

// Load builds the configuration: defaults, the --config file, SHMSTEER_* variables (getenv),
// then the flags set on fs. It validates the result.
func Load(fs *pflag.FlagSet, getenv func(string) string) (Config, error) {
	c := DefaultConfig()
	if fs != nil {
		if path, _ := fs.GetString("config"); path != "" {
			md, err := toml.DecodeFile(path, &c)
			if err != nil {
				return c, fmt.Errorf("%w: reading %s: %w", ErrConfig, path, err)
			}
			if und := md.Undecoded(); len(und) > 0 {
				return c, fmt.Errorf("%w: %s: unknown key %q", ErrConfig, path, und[0].String())
			}
		}
	}
	for _, f := range c.fields() {
		env := "SHMSTEER_" + strings.ToUpper(f.key)
		if s := getenv(env); s != "" {
			if err := setField(f.v, s); err != nil {
				return c, fmt.Errorf("%w: %s=%q: %w", ErrConfig, env, s, err)
			}
		}
		if fs == nil {
			continue
		}
		if fl := fs.Lookup(flagName(f.key)); fl != nil && fl.Changed {
			s := fl.Value.String()
			if sv, ok := fl.Value.(pflag.SliceValue); ok {
				s = strings.Join(sv.GetSlice(), ",")
			}
			if err := setField(f.v, s); err != nil {
				return c, fmt.Errorf("%w: --%s: %w", ErrConfig, fl.Name, err)
			}
		}
	}
	return c, c.Validate()
}

func setField(v reflect.Value, s string) error {
	switch p := v.Addr().Interface().(type) {
	case *string:
		*p = s
	case *int:
		n, err := strconv.Atoi(s)
		if err != nil {
			return err
		}
		*p = n
	case *int64:
		n, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			return err
		}
		*p = n
	case *time.Duration:
		d, err := time.ParseDuration(s)
		if err != nil {
			return err
		}
		*p = d
	case *bool:
		b, err := strconv.ParseBool(s)
		if err != nil {
			return err
		}
		*p = b
	case *[]string:
		*p = nil
		for _, x := range strings.Split(s, ",") {
			if x = strings.TrimSpace(x); x != "" {
				*p = append(*p, x)
			}
		}
	}
	return nil
}

// Model is the model config.
func (c Config) Model() steer.ModelConfig {
	return steer.ModelConfig{Hidden: c.Hidden, Layers: c.Layers, Hooks: c.Hooks}
}

// Policy is the latch policy.
func (c Config) Policy() steer.LatchPolicy {
	if strings.EqualFold(c.LatchPolicy, "lru") {
		return steer.LRU
	}
	return steer.FIFO
}

// Validate checks the fields serve interprets itself (shm and steer check the rest).
func (c Config) Validate() error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: "+format, append([]any{ErrConfig}, args...)...)
	}
	if err := c.Model().Validate(); err != nil {
		return fmt.Errorf("%w: %w", ErrConfig, err)
	}
	if _, err := c.CaptureGlobalSpecs(); err != nil {
		return err
	}
	if err := c.validateColumns(); err != nil {
		return err
	}
	switch {
	case c.Namespace == "":
		return bad("namespace is empty")
	case !strings.EqualFold(c.LatchPolicy, "fifo") && !strings.EqualFold(c.LatchPolicy, "lru"):
		return bad("latch_policy %q: want fifo or lru", c.LatchPolicy)
	case c.MaxConversations < 1 || c.MaxLatchedBytes < 1:
		return bad("max_conversations and max_latched_bytes must be positive")
	case c.HTTP == "":
		return bad("http address is empty: give host:port or unix:PATH")
	case c.Auth != AuthKeys && c.Auth != AuthFork:
		return bad("auth %q: want keys or fork", c.Auth)
	case c.MaxBodyBytes < 1024:
		return bad("max_body_bytes %d: at least 1024", c.MaxBodyBytes)
	case c.MaxUploadBytes < 1024:
		return bad("max_upload_bytes %d: at least 1024", c.MaxUploadBytes)
	case c.MaxTenantBodyBytes < 1024 || c.MaxInflightBodyBytes < c.MaxTenantBodyBytes:
		return bad("max_tenant_body_bytes %d, max_inflight_body_bytes %d: want 1024 <= max_tenant_body_bytes <= max_inflight_body_bytes", c.MaxTenantBodyBytes, c.MaxInflightBodyBytes)
	case c.TenantMaxLatches < 1 || c.TenantMaxLatchedBytes < 1 || c.TenantMaxVectors < 1 || c.TenantMaxVectorBytes < 1 || c.TenantMaxCaptureBytes < 1:
		return bad("tenant_max_latches, tenant_max_latched_bytes, tenant_max_vectors, tenant_max_vector_bytes and tenant_max_capture_bytes must be positive")
	case c.MaxConnections < 16:
		return bad("max_connections %d: at least 16", c.MaxConnections)
	case c.ReadTimeout <= 0 || c.IdleTimeout <= 0:
		return bad("read_timeout and idle_timeout must be positive")
	case c.PersistInterval <= 0:
		return bad("persist_interval must be positive")
	case c.LogFormat != "text" && c.LogFormat != "json":
		return bad("log_format %q: want text or json", c.LogFormat)
	case c.Grace < 0:
		return bad("grace is negative")
	}
	if _, err := parseLevel(c.LogLevel); err != nil {
		return bad("%v", err)
	}
	return c.validateMirror()
}

// validateColumns checks that the column pool columns asks for (0: steer.DefaultColumns,
// negative: none) fits the region's pool for the model (steer.MaxColumns), so serve refuses
// it before creating anything.
func (c Config) validateColumns() error {
	n := c.Columns
	if n < 0 {
		return nil
	}
	if n == 0 {
		n = steer.DefaultColumns
	}
	m := c.Model()
	if most := steer.MaxColumns(m); n > most {
		return fmt.Errorf("%w: columns %d: the region's column pool holds at most %d columns for this model (hidden %d, %d layers, %d hooks); lower --columns (TOML columns) to %d or less, or set it negative for no pool",
			ErrConfig, n, most, m.Hidden, m.Layers, m.NumHooks(), most)
	}
	return nil
}

// validateMirror checks the mirror settings: the other mirror_* settings and host_id mean
// nothing without mirror, so giving them alone is a mistake worth saying.
func (c Config) validateMirror() error {
	if c.Mirror == "" {
		if c.MirrorBucket != "" || c.MirrorCreds != "" || c.MirrorKeys || c.HostID != "" {
			return fmt.Errorf("%w: mirror_bucket, mirror_creds, mirror_keys and host_id need mirror (--mirror nats://HOST:PORT)", ErrConfig)
		}
		return nil
	}
	for _, u := range strings.Split(c.Mirror, ",") {
		pu, err := url.Parse(strings.TrimSpace(u))
		if err != nil || pu.Host == "" || !slices.Contains([]string{"nats", "tls", "ws", "wss"}, pu.Scheme) {
			return fmt.Errorf("%w: mirror %q: want nats://HOST:PORT (or tls://, ws://, wss://), comma-separated for a cluster", ErrConfig, u)
		}
	}
	if c.MirrorCreds != "" {
		if _, err := os.Stat(c.MirrorCreds); err != nil {
			return fmt.Errorf("%w: mirror_creds: %w", ErrConfig, err)
		}
	}
	return nil
}

// CaptureDeclarations reads CaptureConsumers into {name: type}: ErrConfig (wrapping
// capture.ErrBadConsumer or capture.ErrConsumerType) for a bad one or a name given twice.
func (c Config) CaptureDeclarations() (map[string]string, error) {
	decl := map[string]string{}
	for _, d := range c.CaptureConsumers {
		name, typ, err := capture.ParseDeclaration(d)
		if err != nil {
			return nil, fmt.Errorf("%w: capture_consumer: %w", ErrConfig, err)
		}
		if _, ok := decl[name]; ok {
			return nil, fmt.Errorf("%w: capture_consumer %q declared twice", ErrConfig, name)
		}
		decl[name] = typ
	}
	return decl, nil
}

// CaptureGlobalSpecs reads CaptureGlobal (NAME=@FILE) into steer.Options.CaptureGlobal, with
// CaptureDeclarations' checks first: ErrConfig (wrapping capture's error) for a bad form, a
// name given twice or not declared, a file that does not read or a spec that does not check
// (steer.Open checks the rest against the model).
func (c Config) CaptureGlobalSpecs() (map[string]steer.CaptureGlobalSpec, error) {
	decl, err := c.CaptureDeclarations()
	if err != nil || len(c.CaptureGlobal) == 0 {
		return nil, err
	}
	specs := map[string][]byte{}
	for _, g := range c.CaptureGlobal {
		name, path, ok := strings.Cut(g, "=@")
		if !ok || path == "" {
			return nil, fmt.Errorf("%w: capture_global %q, want NAME=@FILE (FILE: the consumer's global spec, JSON)", ErrConfig, g)
		}
		if _, ok := specs[name]; ok {
			return nil, fmt.Errorf("%w: capture_global %q given twice", ErrConfig, name)
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return nil, fmt.Errorf("%w: capture_global %q: %w", ErrConfig, name, err)
		}
		specs[name] = b
	}
	out, err := capture.GlobalSpecs(decl, specs)
	if err != nil {
		return nil, fmt.Errorf("%w: capture_global: %w", ErrConfig, err)
	}
	return out, nil
}
