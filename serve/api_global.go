package serve

import (
	"bytes"
	"math"
	"net/http"
	"slices"
	"sort"
	"strconv"

	"github.com/shmsteer/shmsteer/steer"
)

// noVectorsText is the fork's refusal of a /set with nothing in it. Its router says "No vectors
// or clamps provided"; its older tests look for "No vectors provided": the message holds both.
const noVectorsText = "No vectors or clamps provided (No vectors provided): include at least one of vectors, prefill_vectors, decode_vectors, clamps, prefill_clamps, decode_clamps (or the *_vector_refs) with hook point/layer data"

func (s *Server) setGlobal(_ *http.Request, p principal, body []byte) (any, error) {
	if err := needAdmin(p, "global steering"); err != nil {
		return nil, err
	}
	var req setRequest
	if err := decodePayload(body, &req); err != nil {
		return nil, err
	}
	st, err := req.Steering(s.eng.Config())
	if err != nil {
		return nil, err
	}
	if st.Empty() {
		return nil, badInput("%s", noVectorsText)
	}
	if err := checkSites(&st, s.eng.Config(), styleSet, ""); err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	v, err := s.eng.SetGlobal(st, mergeUnless(req.Replace)...)
	if err != nil {
		return nil, err
	}
	hooks, layers := sites(&st)
	if err := s.persistAfterChange(); err != nil {
		return nil, err
	}
	return map[string]any{"status": "ok", "hook_points": hooks, "layers_updated": layers, "version": v}, nil
}

type site struct {
	hook  string
	layer int
}

// mergeUnless is SetGlobal's options for the API's and the CLI's replace flag: merge per site
// (steer.MergeSites, in the owner under its write lock) unless replace.
func mergeUnless(replace bool) []steer.WriteOption {
	if replace {
		return nil
	}
	return []steer.WriteOption{steer.Merge()}
}

func sites(st *steer.Steering) (hooks []string, layers []int) {
	hooks, layers = []string{}, []int{} // a set of references only answers empty lists, not null
	for _, ph := range []steer.Phase{steer.PhaseBase, steer.PhasePrefill, steer.PhaseDecode} {
		t := st.Tier(ph)
		for _, v := range t.Vectors {
			hooks, layers = append(hooks, v.Hook), append(layers, v.Layer)
		}
		for _, c := range t.Clamps {
			hooks, layers = append(hooks, c.Hook), append(layers, c.Layer)
		}
	}
	slices.Sort(hooks)
	slices.Sort(layers)
	return slices.Compact(hooks), slices.Compact(layers)
}

func (s *Server) clearGlobal(_ *http.Request, p principal, body []byte) (any, error) {
	if err := needAdmin(p, "global steering"); err != nil {
		return nil, err
	}
	if len(bytes.TrimSpace(body)) > 0 {
		var req struct{} // the fork's /clear takes no body; an empty object is accepted
		if err := decodeStrict(body, &req); err != nil {
			return nil, err
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	v, err := s.eng.SetGlobal(steer.Steering{})
	if err != nil {
		return nil, err
	}
	if err := s.persistAfterChange(); err != nil {
		return nil, err
	}
	return map[string]any{"status": "ok", "version": v}, nil
}

// hookNorms is what GET /v1/steering reports per (layer, hook), as the fork's workers do: the
// L2 norm of each tier's summed vector (named references resolved), rounded to 6 decimals,
// under "norm" (base), "prefill_norm" and "decode_norm"; zero norms are left out.
type hookNorms map[string]float64

func (s *Server) getSteering(*http.Request, principal, []byte) (any, error) {
	active, clamps, v, err := activeLayers(s.eng.Engine)
	if err != nil {
		return nil, err
	}
	return map[string]any{"active_layers": active, "clamps": clamps, "version": v}, nil
}

// activeLayers summarizes the global steering: layer → hook → norms (non-zero only), and
// layer → hook → number of clamps (sites with clamps only).
func activeLayers(eng *steer.Engine) (map[string]map[string]hookNorms, map[string]map[string]int, uint64, error) {
	snap, err := eng.Region().Snapshot()
	if err != nil {
		return nil, nil, 0, err
	}
	defer snap.Close()
	out := map[string]map[string]hookNorms{}
	clamps := map[string]map[string]int{}
	g, _, ok, err := eng.Global(&snap)
	if err != nil || !ok {
		return out, clamps, snap.Version(), err
	}
	hidden := eng.Config().Hidden
	type key struct {
		ph steer.Phase
		site
	}
	sums := map[key][]float64{}
	add := func(k key, scale float32, d []float32) {
		acc := sums[k]
		if acc == nil {
			acc = make([]float64, hidden)
			sums[k] = acc
		}
		for i, f := range d {
			acc[i] += float64(scale) * float64(f)
		}
	}
	for _, ph := range []steer.Phase{steer.PhaseBase, steer.PhasePrefill, steer.PhaseDecode} {
		t := g.Tier(ph)
		for _, v := range t.Vectors {
			add(key{ph, site{v.Hook, v.Layer}}, v.Scale, v.Data)
		}
		for _, ref := range t.Refs {
			nv, err := eng.Vector(&snap, ref.Name)
			if err != nil {
				continue // unregistered since: it no longer applies
			}
			for _, v := range nv.Vectors {
				add(key{ph, site{v.Hook, v.Layer}}, ref.Strength*v.Scale, v.Data)
			}
		}
		for _, c := range t.Clamps {
			l := strconv.Itoa(c.Layer)
			if clamps[l] == nil {
				clamps[l] = map[string]int{}
			}
			clamps[l][c.Hook]++
		}
	}
	normKey := map[steer.Phase]string{steer.PhaseBase: "norm", steer.PhasePrefill: "prefill_norm", steer.PhaseDecode: "decode_norm"}
	for k, acc := range sums {
		var ss float64
		for _, f := range acc {
			ss += f * f
		}
		n := math.Round(math.Sqrt(ss)*1e6) / 1e6
		if !(n > 0) {
			continue
		}
		l := strconv.Itoa(k.layer)
		if out[l] == nil {
			out[l] = map[string]hookNorms{}
		}
		if out[l][k.hook] == nil {
			out[l][k.hook] = hookNorms{}
		}
		out[l][k.hook][normKey[k.ph]] = n
	}
	return out, clamps, snap.Version(), nil
}

// getLayers answers the fork's flat {"layers": {layer: {"hook_points": [sorted hooks]}}}:
// every layer of the model has every hook.
func (s *Server) getLayers(*http.Request, principal, []byte) (any, error) {
	cfg := s.eng.Config()
	hooks := make([]string, cfg.NumHooks())
	for i := range hooks {
		hooks[i] = cfg.HookName(steer.HookID(i))
	}
	sort.Strings(hooks)
	flat := map[string]any{}
	for l := range cfg.Layers {
		flat[strconv.Itoa(l)] = map[string]any{"hook_points": hooks}
	}
	return map[string]any{"layers": flat}, nil
}
