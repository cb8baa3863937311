package steer

import (
	"encoding/hex"
	"fmt"
	"math"

	"github.com/shmsteer/shmsteer/kernels"
)

// Phase is the generation phase of a request's rows. Tiers are kept per phase: the base tier
// applies in both phases, the prefill and decode tiers only in theirs.
type Phase uint8

const (
	PhaseBase    Phase = 0 // a tier only: applies to prefill and decode rows alike
	PhasePrefill Phase = 1
	PhaseDecode  Phase = 2
)

func (p Phase) String() string {
	switch p {
	case PhaseBase:
		return "base"
	case PhasePrefill:
		return "prefill"
	case PhaseDecode:
		return "decode"
	}
	return fmt.Sprintf("phase(%d)", uint8(p))
}

// Compose says how a request's own override combines with the steering its conversation has
// latched: ComposeReplace (the default) uses the override alone for this turn, ComposeAdd applies
// the latched steering and the override on top of it. Global steering applies in both cases.
type Compose uint8

const (
	ComposeReplace Compose = 0
	ComposeAdd     Compose = 1
)

// Vector is one entry of a steering set: at (Hook, Layer), add Scale*Data to every row.
// len(Data) must be the model's hidden size.
type Vector struct {
	Hook  string
	Layer int
	Scale float32
	Data  []float32
}

// Ref references a registered named vector: each of its entries is added with
// Strength*entry.Scale.
type Ref struct {
	Name     string
	Strength float32
}

// Clamp projects each row h on the direction Dir at (Hook, Layer), p = h·u with u = Dir/|Dir|,
// and moves it by Strength*(clamp(p, Min, Max) - p) along u, after the adds. Min = Max = 0 with
// Strength 1 ablates the direction. Strength must be in [0, 1] (ErrBadClamp otherwise: see
// MaxMagnitude for why), on every path.
type Clamp struct {
	Hook     string
	Layer    int
	Dir      []float32
	Min, Max float32
	Strength float32
}

// Tier is the steering of one phase tier: inline vectors, references to named vectors and
// clamps. Entries are applied in order; each (hook, layer) may appear once among Vectors.
type Tier struct {
	Vectors []Vector
	Refs    []Ref
	Clamps  []Clamp
}

func (t *Tier) empty() bool { return len(t.Vectors) == 0 && len(t.Refs) == 0 && len(t.Clamps) == 0 }

// Steering is global or per-request steering: a base tier and prefill and decode tiers.
// The effective steering of a row is global base + global phase + request base + request phase.
type Steering struct {
	Base, Prefill, Decode Tier
	// Compose applies to request overrides only (see Compose).
	Compose Compose
}

// Tier returns the tier of phase p.
func (s *Steering) Tier(p Phase) *Tier {
	switch p {
	case PhasePrefill:
		return &s.Prefill
	case PhaseDecode:
		return &s.Decode
	}
	return &s.Base
}

// Empty reports whether s steers nothing.
func (s *Steering) Empty() bool { return s.Base.empty() && s.Prefill.empty() && s.Decode.empty() }

// Digest is a sha256 content digest.
type Digest [32]byte

func (d Digest) String() string { return hex.EncodeToString(d[:]) }

// NamedVector is a registered steering set as read from a snapshot. Vectors' Data alias the
// region (read-only, valid until the snapshot closes).
type NamedVector struct {
	Name    string
	Version uint64 // region version that wrote it
	Digest  Digest // sha256 of its encoding
	Vectors []Vector
}

func finite(f float32) bool { return !math.IsNaN(float64(f)) && !math.IsInf(float64(f), 0) }

// allFinite reports whether no element of v is NaN or ±Inf. A long v goes through the SIMD
// norm: its squares, summed in float64, cannot overflow (float32's largest squared, times
// any slice length that fits memory, is far below float64's range), so the norm is finite
// exactly when every element is.
func allFinite(v []float32) bool {
	if len(v) >= 64 {
		n := kernels.Norm(v)
		return !math.IsNaN(n) && !math.IsInf(n, 0)
	}
	for _, f := range v {
		// f-f is NaN for NaN and ±Inf and 0 otherwise: one branch per element.
		if f-f != 0 {
			return false
		}
	}
	return true
}
