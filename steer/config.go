package steer

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"slices"

	"github.com/shmsteer/shmsteer/internal/proto"
	"github.com/shmsteer/shmsteer/shm"
)

// Region kinds owned by steer (internal/proto's table).
const (
	KindVector  shm.Kind = proto.KindVector  // named steering sets, key = name
	KindGlobal  shm.Kind = proto.KindGlobal  // global tiers, key = globalKey
	KindRequest shm.Kind = proto.KindRequest // admitted steering per request, key = request id
	KindStatus  shm.Kind = proto.KindStatus  // latch counters, key = statusKey
)

const (
	globalKey = "global"
	statusKey = "latches"

	// MaxNameLen is the longest named-vector name.
	MaxNameLen = 256
	// MaxIDLen is the longest request id (the region's key limit).
	MaxIDLen = shm.MaxKeyLen
	// MaxHidden, MaxLayers and MaxHooks bound a ModelConfig.
	MaxHidden = 1 << 20
	MaxLayers = 1 << 16
	MaxHooks  = 32
	// maxHookName bounds one hook name, so every config fits in shm.UserConfigSize.
	maxHookName = 24
)

// DefaultHooks are the hook points of the reference design, in order.
var DefaultHooks = []string{"pre_attn", "post_attn", "post_block", "mlp_in", "mlp_out"}

// ModelConfig describes the model every process steers. It is recorded in the region's
// immutable header when the region is created (RegionConfig), so every process agrees on it.
type ModelConfig struct {
	Hidden int      // hidden size: the length of every steering vector
	Layers int      // number of layers
	Hooks  []string // ordered hook names; nil means DefaultHooks
}

// HookID is a hook's index in ModelConfig.Hooks; the hot path takes ids, not names.
type HookID uint16

func (c ModelConfig) hooks() []string {
	if c.Hooks == nil {
		return DefaultHooks
	}
	return c.Hooks
}

// Validate checks every field.
func (c ModelConfig) Validate() error {
	if c.Hidden < 1 || c.Hidden > MaxHidden {
		return fmt.Errorf("%w: hidden size %d not in [1, %d]", ErrBadConfig, c.Hidden, MaxHidden)
	}
	if c.Layers < 1 || c.Layers > MaxLayers {
		return fmt.Errorf("%w: layers %d not in [1, %d]", ErrBadConfig, c.Layers, MaxLayers)
	}
	hs := c.hooks()
	if len(hs) < 1 || len(hs) > MaxHooks {
		return fmt.Errorf("%w: %d hooks, want 1..%d", ErrBadConfig, len(hs), MaxHooks)
	}
	for i, h := range hs {
		if len(h) == 0 || len(h) > maxHookName {
			return fmt.Errorf("%w: hook name %q empty or longer than %d bytes", ErrBadConfig, h, maxHookName)
		}
		if slices.Contains(hs[:i], h) {
			return fmt.Errorf("%w: hook %q listed twice", ErrBadConfig, h)
		}
	}
	return nil
}

// Hook resolves a hook name to its id.
func (c ModelConfig) Hook(name string) (HookID, error) {
	for i, h := range c.hooks() {
		if h == name {
			return HookID(i), nil
		}
	}
	return 0, fmt.Errorf("%w: %q", ErrUnknownHook, name)
}

// HookName is the name of hook id (empty if out of range).
func (c ModelConfig) HookName(id HookID) string {
	if hs := c.hooks(); int(id) < len(hs) {
		return hs[id]
	}
	return ""
}

// NumHooks is the number of hooks.
func (c ModelConfig) NumHooks() int { return len(c.hooks()) }

// configMagic starts the UserConfig bytes; its last byte is the encoding's version.
var configMagic = []byte("shmsteer/steer\x00\x01")

// MarshalBinary encodes the config for the region header (at most shm.UserConfigSize bytes).
func (c ModelConfig) MarshalBinary() ([]byte, error) {
	if err := c.Validate(); err != nil {
		return nil, err
	}
	b := slices.Clone(configMagic)
	b = binary.LittleEndian.AppendUint32(b, uint32(c.Hidden))
	b = binary.LittleEndian.AppendUint32(b, uint32(c.Layers))
	hs := c.hooks()
	b = append(b, byte(len(hs)))
	for _, h := range hs {
		b = append(b, byte(len(h)))
		b = append(b, h...)
	}
	return b, nil
}

// UnmarshalBinary decodes MarshalBinary's bytes; trailing zero padding is allowed.
// ErrIncompatible if they are not a config of this version.
func (c *ModelConfig) UnmarshalBinary(b []byte) error {
	bad := func(what string) error {
		return fmt.Errorf("%w (%w): region config %s", ErrIncompatible, shm.ErrIncompatible, what)
	}
	if !bytes.HasPrefix(b, configMagic) {
		return bad("missing or from another steer version")
	}
	b = b[len(configMagic):]
	if len(b) < 9 {
		return bad("truncated")
	}
	out := ModelConfig{Hidden: int(binary.LittleEndian.Uint32(b)), Layers: int(binary.LittleEndian.Uint32(b[4:]))}
	n := int(b[8])
	b = b[9:]
	for range n {
		if len(b) < 1 || len(b) < 1+int(b[0]) {
			return bad("truncated hook list")
		}
		out.Hooks = append(out.Hooks, string(b[1:1+int(b[0])]))
		b = b[1+int(b[0]):]
	}
	for _, x := range b {
		if x != 0 {
			return bad("has trailing bytes")
		}
	}
	if err := out.Validate(); err != nil {
		return bad(err.Error())
	}
	*c = out
	return nil
}

// Equal reports whether two configs describe the same model (nil Hooks equals DefaultHooks).
func (c ModelConfig) Equal(o ModelConfig) bool {
	return c.Hidden == o.Hidden && c.Layers == o.Layers && slices.Equal(c.hooks(), o.hooks())
}

// DefaultColumns is the column pool RegionConfig gives a region when base.Columns is 0: the
// requests carrying their own vectors that can be admitted at once with those vectors laid
// out site by site (composed.go's Columns section); more are stored in their entries. vLLM's
// default max_num_seqs.
const DefaultColumns = 256

// MaxColumns is the most columns RegionConfig's base.Columns may ask for cfg's model (one
// cell per (hook, layer) of hidden float32s, as RegionConfig sizes them): shm.MaxColumns of
// that geometry. shm.Create refuses more (shm.ErrBadConfig).
func MaxColumns(cfg ModelConfig) int {
	cells, cellBytes := poolGeometry(cfg)
	return shm.MaxColumns(cells, cellBytes)
}

// poolGeometry is the cells of a column and the bytes of a cell of cfg's column pool.
func poolGeometry(cfg ModelConfig) (cells, cellBytes int) {
	return cfg.NumHooks() * cfg.Layers, int(roundUp64(uint64(cfg.Hidden) * 4))
}

// RegionConfig returns base with UserConfig set to cfg's encoding and its column pool sized
// for the model (one cell per (hook, layer) of hidden float32s; base.Columns columns, 0 for
// DefaultColumns, negative for none), for shm.Create (or ipc.OwnerOptions.Region). The pool
// is address space: a cell takes memory only once a request's vector is written there.
func RegionConfig(cfg ModelConfig, base shm.Config) (shm.Config, error) {
	b, err := cfg.MarshalBinary()
	if err != nil {
		return base, err
	}
	base.UserConfig = b
	switch {
	case base.Columns < 0:
		base.Columns, base.ColumnCells, base.CellBytes = 0, 0, 0
	default:
		if base.Columns == 0 {
			base.Columns = DefaultColumns
		}
		base.ColumnCells, base.CellBytes = poolGeometry(cfg)
	}
	return base, nil
}

// ConfigOf reads the model config recorded in a region.
func ConfigOf(r *shm.Region) (ModelConfig, error) {
	var c ModelConfig
	err := c.UnmarshalBinary(r.UserConfig())
	return c, err
}
