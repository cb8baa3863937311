package serve

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/shmsteer/shmsteer/capture"

	"github.com/shmsteer/shmsteer/internal/proto"
	"github.com/shmsteer/shmsteer/ipc"
	"github.com/shmsteer/shmsteer/keys"
	"github.com/shmsteer/shmsteer/mirror"
	"github.com/shmsteer/shmsteer/shm"
	"github.com/shmsteer/shmsteer/steer"
)

// KindServe is the region kind of serve's own entries: key "ready" is written once the
// persisted state is restored, so that workers following an owner restart switch only to a
// region that holds that state (ipc.FollowOptions.Ready = IsReady).
const KindServe shm.Kind = proto.KindServe

const readyKey = "ready"

// IsReady reports whether the region c is attached to was published as ready by serve.
func IsReady(c *ipc.Client) bool {
	_, err := c.Region().Get(KindServe, readyKey, nil)
	return err == nil
}

// Server is a running `shmsteer serve`: the region's owner, its control API and its state.
type Server struct {
	cfg    Config
	log    *slog.Logger
	owner  *ipc.Owner
	reg    *keys.Owner // the owner's key registry
	eng    *steer.Owner
	keys   apiKeys
	store  *stateStore // nil without --state-dir
	met    *metrics
	bodies *bodyBudget // request body bytes in flight

	mirror *mirror.Mirror // nil without --mirror; set before the control API serves
	hub    *capture.Hub   // nil without --capture-consumer (capture.go)
	capMu  sync.Mutex     // tenants' admissions with capture (admitCounted, quota.go)

	mu      sync.Mutex // serializes mutations through the API and state captures
	modules map[string]module
	checks  checksums
	gwork   gateWork
	colWarn columnsWarning // the pool-full warning's rate limit (columns.go)

	dirty     atomic.Bool   // latch changes not yet persisted
	saves     atomic.Uint64 // state files written since start
	saveErr   atomic.Pointer[string]
	ready     atomic.Bool
	startedAt time.Time
}

// module is a registered steering module: a full steering set kept by name.
type module struct {
	wire   []byte
	digest steer.Digest
}

// NewLogger makes the slog logger serve uses (text or JSON on w).
func NewLogger(cfg Config, w io.Writer) *slog.Logger {
	lvl, _ := parseLevel(cfg.LogLevel)
	opts := &slog.HandlerOptions{Level: lvl}
	if cfg.LogFormat == "json" {
		return slog.New(slog.NewJSONHandler(w, opts))
	}
	return slog.New(slog.NewTextHandler(w, opts))
}

func parseLevel(s string) (slog.Level, error) {
	var l slog.Level
	if err := l.UnmarshalText([]byte(s)); err != nil {
		return 0, fmt.Errorf("log_level %q: want debug, info, warn or error", s)
	}
	return l, nil
}

// Run serves until ctx is done: it creates the region, restores the state, listens on the
// control address, prints "listening on ADDR" to stdout, and at the end stops accepting,
// answers calls in flight, persists the state and closes the region.
func Run(ctx context.Context, cfg Config, stdout io.Writer, log *slog.Logger) error {
	if err := cfg.Validate(); err != nil {
		return err
	}
	s := &Server{cfg: cfg, log: log, modules: map[string]module{}, startedAt: time.Now(),
		bodies: newBodyBudget(cfg.MaxInflightBodyBytes, cfg.MaxTenantBodyBytes)}
	nkeys, err := s.keys.load(cfg.APIKeyFile)
	if err != nil {
		return err
	}
	if err := checkForkAuth(cfg, nkeys, s.keys.tenants()); err != nil {
		return err
	}
	switch {
	case nkeys == 0 && cfg.Auth == AuthFork:
		log.Warn("--auth fork and no API keys: the control API is open to every local caller")
	case nkeys == 0:
		log.Warn("no API keys configured: every /v1/ call is refused; give --api-key-file")
	}
	secret, err := s.secret()
	if err != nil {
		return err
	}
	if cfg.StateDir != "" {
		if s.store, err = openStateStore(cfg.StateDir); err != nil {
			return err
		}
		defer s.store.close()
		if n := s.store.tmpGone; n > 0 {
			log.Info("removed temporary files of interrupted saves", "dir", cfg.StateDir, "files", n)
		}
	}
	if err := s.openOwner(secret); err != nil {
		return err
	}
	defer func() {
		if s.owner != nil { // closed here on an early return; shutdown closes it otherwise
			s.owner.Close()
		}
	}()
	if err := s.openCapture(); err != nil {
		return err
	}
	if s.hub != nil {
		defer s.hub.Close()
	}
	s.serveRPC()
	if err := s.restoreAndPublish(); err != nil {
		return err
	}
	if cfg.Mirror != "" {
		if err := s.startMirror(ctx, secret); err != nil {
			return err
		}
		defer s.mirror.Close()
	}
	// SIGHUP is caught before the address is announced: its default action would end serve.
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	srv, ln, addr, err := s.listenHTTP()
	if err != nil {
		return err
	}
	serveErr := make(chan error, 1)
	go func() { serveErr <- srv.Serve(ln) }()
	s.ready.Store(true)
	fmt.Fprintf(stdout, "listening on %s\n", addr)
	m := s.eng.Config()
	log.Info("serving", "http", addr, "namespace", cfg.Namespace, "hidden", m.Hidden, "layers", m.Layers, "api_keys", nkeys)
	runErr := s.loop(ctx, hup, serveErr)
	return errors.Join(runErr, s.shutdown(srv))
}

// secret resolves the shared secret: --secret-file, or with --mirror SHMSTEER_SECRET (the
// mirror authenticates every value, and seals keys, with keys derived from it, and the owner
// drops SHMSTEER_SECRET from the environment once read, so it is resolved here for both). nil
// leaves it to NewOwner, which says what is missing.
func (s *Server) secret() (*ipc.Secret, error) {
	if s.cfg.SecretFile != "" {
		sec, err := ipc.SecretFromFile(s.cfg.SecretFile, ipc.SecretFileOptions{Private: true})
		if err != nil {
			return nil, err
		}
		return &sec, nil
	}
	if s.cfg.Mirror != "" {
		if sec, err := ipc.SecretFromEnv(); err == nil {
			return &sec, nil
		}
	}
	return nil, nil
}

// openOwner creates the region and its owner, and the steering engine on it.
func (s *Server) openOwner(secret *ipc.Secret) error {
	cfg, model := s.cfg, s.cfg.Model()
	rc, err := steer.RegionConfig(model, shm.Config{IndexSlots: cfg.IndexSlots, ArenaBytes: cfg.ArenaBytes, ReaderSlots: cfg.ReaderSlots, Columns: cfg.Columns})
	if err != nil {
		return fmt.Errorf("%w: %w", ErrConfig, err)
	}
	s.owner, err = ipc.NewOwner(ipc.OwnerOptions{Secret: secret, Namespace: cfg.Namespace, Region: rc,
		SpinWait: cfg.Spin, DropEnv: true, Logger: s.log})
	if err != nil {
		return err
	}
	if s.reg, err = keys.Open(s.owner, keys.Options{Grace: cfg.Grace, Logger: s.log}); err != nil {
		return err
	}
	decl, err := cfg.CaptureDeclarations()
	if err != nil {
		return err
	}
	consumers, err := capture.Validators(decl)
	if err != nil {
		return fmt.Errorf("%w: %w", ErrConfig, err)
	}
	global, err := cfg.CaptureGlobalSpecs()
	if err != nil {
		return err
	}
	s.eng, err = steer.Open(s.owner.Region(), &model, steer.Options{
		CaptureConsumers: consumers,
		CaptureGlobal:    global,
		Latch: steer.LatchConfig{MaxConversations: cfg.MaxConversations, MaxLatchedBytes: cfg.MaxLatchedBytes, Policy: cfg.Policy(),
			MaxPerTenant: cfg.TenantMaxLatches, MaxTenantBytes: cfg.TenantMaxLatchedBytes},
		Clients: s.owner.Clients,
		Logf:    func(format string, args ...any) { s.log.Warn(fmt.Sprintf(format, args...)) },
	})
	if err == nil {
		// The conversations' rest_of_conversation gates change with admissions, workers'
		// reports and the mirror: persisted within persist_interval, as the latches are.
		s.eng.OnChange(func(c steer.Change) {
			if c.Kind == steer.ChangeConversation {
				s.dirty.Store(true)
			}
		})
	}
	return err
}

// serveRPC registers the owner's RPC handlers: steering writes from workers and the CLI
// (register, unregister, global) are persisted before their reply, like the API's.
func (s *Server) serveRPC() {
	s.met = newMetrics(s)
	handle := func(op uint16, h func([]byte) ([]byte, error)) { s.owner.Handle(op, s.met.timeRPC(op, h)) }
	persisting := func(op uint16, h func([]byte) ([]byte, error)) {
		handle(op, func(req []byte) ([]byte, error) {
			out, err := h(req)
			if err == nil {
				s.dirty.Store(true)
				if op != steer.OpGateEngaged { // like the latch changes: within persist_interval
					s.persistLogged()
				}
			}
			return out, err
		})
	}
	s.eng.Serve(persisting)
	handle(OpReportChecksum, s.checks.handle)
	if s.hub != nil {
		s.hub.Serve(handle)
	}
	handle(steer.OpReportGates, s.gwork.handle)
	handle(OpGateWork, s.gwork.handleQuery)
}

// restoreAndPublish restores the saved state, then writes the readiness marker that tells a
// Follower (IsReady) the restored state is in. Workers may attach from NewOwner on.
func (s *Server) restoreAndPublish() error {
	t0 := time.Now()
	restored, err := s.restore()
	if err != nil {
		return err
	}
	if _, err := s.owner.Region().Put(KindServe, readyKey, binary.LittleEndian.AppendUint64(nil, uint64(time.Now().UnixNano()))); err != nil {
		return fmt.Errorf("shmsteer: publishing readiness: %w", err)
	}
	switch {
	case restored:
		s.log.Info("state restored", "dir", s.cfg.StateDir, "took", time.Since(t0).String())
	case s.store != nil:
		s.log.Info("no saved state yet; starting empty", "dir", s.cfg.StateDir)
	}
	return nil
}

// listenHTTP listens on the control address with the connection cap, and makes the HTTP
// server with its timeouts.
func (s *Server) listenHTTP() (*http.Server, net.Listener, string, error) {
	n, err := connCap(s.cfg.MaxConnections)
	if err != nil {
		return nil, nil, "", err
	}
	if n < s.cfg.MaxConnections {
		s.log.Warn("max_connections lowered to keep file descriptors for workers and state; raise ulimit -n to allow more",
			"max_connections", n, "configured", s.cfg.MaxConnections, "reserved", fdReserve)
	}
	ln, addr, err := listen(s.cfg.HTTP)
	if err != nil {
		return nil, nil, "", err
	}
	lim := newConnLimiter(ln, n)
	srv := &http.Server{Handler: s.routes(), ConnState: lim.ConnState,
		ReadHeaderTimeout: min(10*time.Second, s.cfg.ReadTimeout), ReadTimeout: s.cfg.ReadTimeout, IdleTimeout: s.cfg.IdleTimeout,
		ErrorLog: slog.NewLogLogger(s.log.Handler(), slog.LevelWarn)}
	return srv, lim, addr, nil
}

// loop runs until ctx is done or the HTTP server fails: SIGHUP reloads the API keys, and
// latch changes are persisted every persist_interval (when serve also checks whether the
// column pool was found full: warnColumnsFull).
func (s *Server) loop(ctx context.Context, hup <-chan os.Signal, serveErr <-chan error) error {
	tick := time.NewTicker(s.cfg.PersistInterval)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case err := <-serveErr:
			return fmt.Errorf("shmsteer: control API: %w", err)
		case <-hup:
			if n, err := s.reloadKeys(); err != nil {
				s.log.Error("API keys not reloaded; the old keys stay", "err", err)
			} else if n == 0 && s.cfg.Auth == AuthFork {
				s.log.Warn("API keys reloaded: the file holds no key, so the control API is open to every local caller (--auth fork)", "keys", 0)
			} else if n == 0 {
				s.log.Warn("API keys reloaded: the file holds no key, so every /v1/ call is refused until one is added (SIGHUP again)", "keys", 0)
			} else {
				s.log.Info("API keys reloaded", "keys", n)
			}
		case now := <-tick.C:
			s.warnColumnsFull(now)
			if s.dirty.Load() {
				s.persistLogged()
			}
		}
	}
}

// shutdown stops accepting and answers the calls in flight (10 s at most), stops the mirror,
// persists the state and closes the region.
func (s *Server) shutdown(srv *http.Server) error {
	s.log.Info("shutting down")
	s.ready.Store(false)
	var errs []error
	sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := srv.Shutdown(sctx); err != nil {
		errs = append(errs, fmt.Errorf("shmsteer: control API shutdown: %w", err))
	}
	if s.mirror != nil {
		if q := s.mirror.Status().QueueDepth; q > 0 {
			s.log.Warn("mirror stopped with changes not yet published", "queued", q)
		}
		s.mirror.Close()
	}
	if s.store != nil {
		if err := s.persist(); err != nil {
			errs = append(errs, err)
		}
	}
	if s.hub != nil {
		s.hub.Close() // consumers and workers see the hub go before the owner
	}
	owner := s.owner
	s.owner = nil
	if err := owner.Close(); err != nil {
		errs = append(errs, err)
	}
	if path, ok := strings.CutPrefix(s.cfg.HTTP, "unix:"); ok {
		os.Remove(path)
	}
	return errors.Join(errs...)
}

// startMirror starts mirroring through NATS after the restore, so the restored state does not
// count as new writes that would win over newer values in the bucket: the bucket's values are
// applied over it instead. It does not wait for NATS (local serving never depends on it).
// Changes applied from other hosts mark the state dirty, so they are persisted like the rest.
func (s *Server) startMirror(ctx context.Context, secret *ipc.Secret) error {
	m, err := mirror.Start(ctx, mirror.Options{URL: s.cfg.Mirror, Bucket: s.cfg.MirrorBucket, CredsFile: s.cfg.MirrorCreds,
		HostID: s.cfg.HostID, MirrorKeys: s.cfg.MirrorKeys, Secret: secret, Engine: s.eng, Keys: s.reg, Logger: s.log})
	if errors.Is(err, mirror.ErrBadOptions) {
		return fmt.Errorf("%w: %w", ErrConfig, err)
	} else if err != nil {
		return err
	}
	s.mirror = m
	unhook := s.eng.OnChange(func(c steer.Change) {
		if c.Origin != "" {
			s.dirty.Store(true)
		}
	})
	go func() { <-ctx.Done(); unhook() }()
	st := m.Status()
	s.log.Info("mirroring steering state", "nats", s.cfg.Mirror, "bucket", st.Bucket, "host_id", st.HostID, "keys", s.cfg.MirrorKeys)
	return nil
}

func listen(addr string) (net.Listener, string, error) {
	if path, ok := strings.CutPrefix(addr, "unix:"); ok {
		if st, err := os.Lstat(path); err == nil && st.Mode()&os.ModeSocket != 0 {
			if c, err := net.Dial("unix", path); err == nil {
				c.Close()
				return nil, "", fmt.Errorf("%w: %s: another process listens there", ErrConfig, addr)
			}
			os.Remove(path) // stale socket of a dead server
		}
		ln, err := net.Listen("unix", path)
		if err != nil {
			return nil, "", fmt.Errorf("shmsteer: listening on %s: %w", addr, err)
		}
		if err := os.Chmod(path, 0o600); err != nil {
			ln.Close()
			return nil, "", err
		}
		return ln, "unix:" + path, nil
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, "", fmt.Errorf("shmsteer: listening on %s: %w (give --http host:port or unix:PATH)", addr, err)
	}
	return ln, ln.Addr().String(), nil
}

// capture reads the state to persist and saves it with the vector encodings read from the
// same snapshot. Callers hold s.mu.
func (s *Server) captureAndSave() error {
	p := &persisted{Model: s.eng.Config()}
	snap, err := s.eng.Region().Snapshot()
	if err != nil {
		return err
	}
	defer snap.Close()
	infos, err := s.eng.VectorInfos(&snap)
	if err != nil {
		return err
	}
	type entry struct {
		kind shm.Kind
		name string
	}
	byDigest := map[steer.Digest]entry{}
	for _, in := range infos {
		p.Vectors = append(p.Vectors, namedDigest{Name: in.Name, Digest: in.Digest, ModelHint: in.ModelHint})
		byDigest[in.Digest] = entry{steer.KindVector, in.Name}
	}
	probes, err := s.eng.ProbeInfos(&snap)
	if err != nil {
		return err
	}
	for _, in := range probes {
		p.Probes = append(p.Probes, namedDigest{Name: in.Name, Digest: in.Digest})
		if _, ok := byDigest[in.Digest]; !ok { // the same digest is the same encoding
			byDigest[in.Digest] = entry{steer.KindProbe, in.Name}
		}
	}
	wire := func(d steer.Digest) ([]byte, error) {
		e := byDigest[d]
		b, _, err := snap.View(e.kind, e.name)
		return b, err
	}
	g, _, ok, err := s.eng.Global(&snap)
	if err != nil {
		return err
	}
	if ok {
		if p.Global, _, err = steer.EncodeSteering(&g, s.eng.Config()); err != nil {
			return err
		}
	}
	for name, m := range s.modules {
		p.Modules = append(p.Modules, namedWire{Name: name, Wire: m.wire})
	}
	p.Latches, p.LatchStats = s.eng.Latches().Export()
	if p.GateConversations, err = s.eng.GateConversations(); err != nil {
		return err
	}
	return s.store.save(p, wire)
}

// persist writes the state file now (no-op without a state dir).
func (s *Server) persist() error {
	if s.store == nil {
		return nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.persistLocked()
}

func (s *Server) persistLocked() error {
	if s.store == nil {
		return nil
	}
	s.dirty.Store(false)
	if err := s.captureAndSave(); err != nil {
		s.dirty.Store(true)
		msg := err.Error()
		s.saveErr.Store(&msg)
		return err
	}
	s.saveErr.Store(nil)
	s.saves.Add(1)
	return nil
}

func (s *Server) persistLogged() {
	if err := s.persist(); err != nil {
		s.log.Error("persisting state failed; will retry", "err", err)
	}
}

// restore loads the state file into the fresh region; any failure stops the start.
func (s *Server) restore() (bool, error) {
	if s.store == nil {
		return false, nil
	}
	p, err := s.store.load()
	if err != nil || p == nil {
		return false, err
	}
	cfg := s.eng.Config()
	if !p.Model.Equal(cfg) {
		return false, fmt.Errorf("%w: written for hidden %d, %d layers, hooks %v; serving hidden %d, %d layers, hooks %v",
			ErrStateIncompatible, p.Model.Hidden, p.Model.Layers, p.Model.Hooks, cfg.Hidden, cfg.Layers, cfg.Hooks)
	}
	fail := func(what string, err error) error {
		if errors.Is(err, shm.ErrRegionFull) {
			return fmt.Errorf("%w: %s: %w: the saved state does not fit this region; raise --arena-bytes or --index-slots", ErrStateIncompatible, what, err)
		}
		return fmt.Errorf("%w: %s: %w (nothing is served from this state)", ErrStateCorrupt, what, err)
	}
	for i, v := range slices.Concat(p.Vectors, p.Probes) {
		what, reg := "named vector "+v.Name, s.eng.Register
		if i >= len(p.Vectors) {
			what, reg = "probe vector "+v.Name, s.eng.RegisterProbe
		}
		b, err := s.store.readVector(v.Digest)
		if err != nil {
			return false, fail(what, err)
		}
		st, d, err := steer.DecodeSteering(b, cfg)
		if err == nil && d != v.Digest {
			err = errors.New("vector file holds another digest")
		}
		if err != nil {
			return false, fail(what, err)
		}
		var opts []steer.WriteOption
		if v.ModelHint != "" {
			opts = append(opts, steer.ModelHint(v.ModelHint))
		}
		info, err := reg(v.Name, st.Base.Vectors, opts...)
		if err != nil {
			return false, fail(what, err)
		}
		if info.Digest != d {
			return false, fail(what, errors.New("digest differs after restore"))
		}
	}
	names := map[string]bool{}
	for _, v := range p.Vectors {
		names[v.Name] = true
	}
	if p.Global != nil {
		g, _, err := steer.DecodeSteering(p.Global, cfg)
		if err != nil {
			return false, fail("global steering", err)
		}
		// A reference to a vector unregistered since applied nothing; SetGlobal refuses it.
		for _, ph := range []steer.Phase{steer.PhaseBase, steer.PhasePrefill, steer.PhaseDecode} {
			t := g.Tier(ph)
			t.Refs = slices.DeleteFunc(t.Refs, func(r steer.Ref) bool {
				if !names[r.Name] {
					s.log.Warn("global steering referenced an unregistered vector; dropped on restore", "vector", r.Name, "tier", ph.String())
					return true
				}
				return false
			})
		}
		if _, err := s.eng.SetGlobal(g); err != nil {
			return false, fail("global steering", err)
		}
	}
	for _, m := range p.Modules {
		_, d, err := steer.DecodeSteering(m.Wire, cfg)
		if err != nil {
			return false, fail("module "+m.Name, err)
		}
		s.modules[m.Name] = module{wire: m.Wire, digest: d}
	}
	if err := s.eng.RestoreLatches(p.Latches, p.LatchStats); err != nil {
		return false, fail("latches", err)
	}
	for _, b := range p.GateConversations { // oldest first, as saved
		if err := s.eng.RestoreGateConversation(b); err != nil {
			return false, fail("conversation gates", err)
		}
	}
	return true, nil
}

// UnregisterVector unregisters a named vector (in the owner, or from a worker through it) and
// says which steering sets had their references to it dropped in the same write: ["global"]
// if the global steering referenced it (steer.Engine.Unregister drops them and recomposes),
// else empty. A global write by another process between its two reads can make the answer
// wrong, never the state.
func UnregisterVector(eng *steer.Engine, name string) (uint64, []string, error) {
	referenced := func() (bool, uint64, error) {
		snap, err := eng.Region().Snapshot()
		if err != nil {
			return false, 0, err
		}
		defer snap.Close()
		g, _, ok, err := eng.Global(&snap)
		if err != nil || !ok {
			return false, 0, err
		}
		_, ver, _, err := eng.Encoding(&snap, steer.ChangeGlobal, "")
		for _, ph := range []steer.Phase{steer.PhaseBase, steer.PhasePrefill, steer.PhaseDecode} {
			for _, r := range g.Tier(ph).Refs {
				if r.Name == name {
					return true, ver, err
				}
			}
		}
		return false, ver, err
	}
	before, _, err := referenced()
	if err != nil {
		return 0, nil, err
	}
	v, err := eng.Unregister(name)
	if err != nil {
		return 0, nil, err
	}
	dropped := []string{}
	if before {
		// The global steering was rewritten (its version is v) or deleted in the unregister's
		// write; a worker's global write in between would carry another version.
		if _, ver, err := referenced(); err == nil && (ver == v || ver == 0) {
			dropped = append(dropped, "global")
		}
	}
	return v, dropped, nil
}
