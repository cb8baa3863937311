package serve

// The cases of apiRouterCases, the fork's test_api_router.py, by its test classes.

import (
	"encoding/base64"
	"testing"

	"github.com/stretchr/testify/require"
)

// apiSetCases ports the fork's TestSetSteeringBase: POST /v1/steering/set's basic bodies and
// errors.
func apiSetCases() []forkCase {
	set := forkSet
	return []forkCase{
		{epSet, fAPI + "::TestSetSteeringBase::test_set_basic", func(t *testing.T, f *forkServer) {
			m := set(t, f, vecs(map[string]any{"0": row(1, 2, 3)}))
			require.Equal(t, "ok", m["status"])
			require.Equal(t, []any{0.0}, m["layers_updated"])
		}, nil},
		{epSet, fAPI + "::TestSetSteeringBase::test_set_multiple_layers", func(t *testing.T, f *forkServer) {
			m := set(t, f, vecs(map[string]any{"0": row(1), "3": row(2)}))
			require.Equal(t, []any{0.0, 3.0}, m["layers_updated"])
		}, nil},
		{epSet, fAPI + "::TestSetSteeringBase::test_set_with_co_located_scale", func(t *testing.T, f *forkServer) {
			set(t, f, map[string]any{"vectors": map[string]any{hp: map[string]any{"0": map[string]any{"vector": row(1, 2), "scale": 3.0}}}})
			require.InDelta(t, norm(row(3, 6)), f.normAt(t, 0, hp, "norm"), 1e-6)
		}, nil},
		{epSet, fAPI + "::TestSetSteeringBase::test_set_bare_list_scale_one", func(t *testing.T, f *forkServer) {
			set(t, f, vecs(map[string]any{"0": row(5, 10)}))
			require.InDelta(t, norm(row(5, 10)), f.normAt(t, 0, hp, "norm"), 1e-6)
		}, nil},
		{epSet, fAPI + "::TestSetSteeringBase::test_set_missing_layer_returns_400", func(t *testing.T, f *forkServer) {
			f.fails(t, "/v1/steering/set", vecs(map[string]any{"999": row(1)}), 400, "999")
		}, nil},
		{epSet, fAPI + "::TestSetSteeringBase::test_set_partial_missing_layers", func(t *testing.T, f *forkServer) {
			m := f.fails(t, "/v1/steering/set", vecs(map[string]any{"0": row(1), "999": row(1)}), 400, "999")
			require.Contains(t, m["error"], "not found in model")
			require.Empty(t, f.active(t), "nothing applied")
		}, nil},
		{epSet, fAPI + "::TestSetSteeringBase::test_set_vector_size_mismatch_returns_400", func(t *testing.T, f *forkServer) {
			m := f.fails(t, "/v1/steering/set", vecs(map[string]any{"0": []float64{1, 2, 3}}), 400, "expected vector of size")
			require.Equal(t, "hidden_size", m["type"])
		}, nil},
		{epSet, fAPI + "::TestSetSteeringBase::test_set_nonfinite_returns_400", func(t *testing.T, f *forkServer) {
			// JSON has no NaN: a value beyond float32 is the non-finite input a client can send.
			m := f.fails(t, "/v1/steering/set", `{"vectors":{"post_block":{"0":[1e39,0,0,0,0,0,0,0]}}}`, 400, "non-finite")
			require.Equal(t, "non_finite", m["type"])
		}, nil},
		{epSet, fAPI + "::TestSetSteeringBase::test_set_with_replace", func(t *testing.T, f *forkServer) {
			set(t, f, vecs(map[string]any{"1": row(1)}))
			set(t, f, map[string]any{"vectors": map[string]any{hp: map[string]any{"0": row(1)}}, "replace": true})
			require.NotContains(t, f.active(t), "1", "replace=true cleared the other layers")
			require.Contains(t, f.active(t), "0")
		}, nil},
		{epSet, fAPI + "::TestSetSteeringBase::test_set_without_replace_no_clear", func(t *testing.T, f *forkServer) {
			set(t, f, vecs(map[string]any{"1": row(1)}))
			set(t, f, vecs(map[string]any{"0": row(1)}))
			require.Contains(t, f.active(t), "1", "without replace the other layers stay")
		}, nil},
		{epSet, fAPI + "::TestSetSteeringBase::test_set_without_replace_passes_false", func(t *testing.T, f *forkServer) {
			set(t, f, map[string]any{"decode_vectors": map[string]any{hp: map[string]any{"2": row(1)}}})
			set(t, f, map[string]any{"vectors": map[string]any{hp: map[string]any{"0": row(1)}}, "replace": false})
			require.InDelta(t, 1, f.normAt(t, 2, hp, "decode_norm"), 1e-6, "replace=false keeps the other tiers' sites")
		}, nil},
		{epSet, fAPI + "::TestSetSteeringBase::test_set_empty_all_tiers", func(t *testing.T, f *forkServer) {
			f.fails(t, "/v1/steering/set", map[string]any{}, 400, "No vectors provided")
		}, nil},
		{epSet, fAPI + "::TestSetSteeringBase::test_set_empty_vectors", func(t *testing.T, f *forkServer) {
			m := f.fails(t, "/v1/steering/set", map[string]any{"vectors": map[string]any{}}, 400, "No vectors provided")
			require.Contains(t, m["error"], "No vectors or clamps provided", "the router's own text too")
		}, nil},
		{epSet, fAPI + "::TestSetSteeringBase::test_set_invalid_hook_point", func(t *testing.T, f *forkServer) {
			m := f.fails(t, "/v1/steering/set", map[string]any{"vectors": map[string]any{"invalid_hook": map[string]any{"0": row(1)}}}, 400, "Invalid hook point")
			require.Equal(t, "unknown_hook", m["type"])
		}, nil},
	}
}

// apiTierCases ports TestSetSteeringThreeTier, TestClearSteering, TestGetSteering,
// TestNormalizeSpec and TestAttachRouter.
func apiTierCases() []forkCase {
	set := forkSet
	return []forkCase{
		{epSet, fAPI + "::TestSetSteeringThreeTier::test_set_prefill_only", func(t *testing.T, f *forkServer) {
			m := set(t, f, map[string]any{"prefill_vectors": map[string]any{hp: map[string]any{"0": row(1, 2)}}})
			require.Equal(t, "ok", m["status"])
			require.Equal(t, []any{0.0}, m["layers_updated"])
		}, nil},
		{epSet, fAPI + "::TestSetSteeringThreeTier::test_set_decode_only", func(t *testing.T, f *forkServer) {
			m := set(t, f, map[string]any{"decode_vectors": map[string]any{hp: map[string]any{"1": row(3, 4)}}})
			require.Equal(t, []any{1.0}, m["layers_updated"])
		}, nil},
		{epSet, fAPI + "::TestSetSteeringThreeTier::test_set_all_three_tiers", func(t *testing.T, f *forkServer) {
			m := set(t, f, map[string]any{"vectors": map[string]any{hp: map[string]any{"0": row(1)}},
				"prefill_vectors": map[string]any{hp: map[string]any{"1": row(2)}}, "decode_vectors": map[string]any{hp: map[string]any{"2": row(3)}}})
			require.Equal(t, []any{0.0, 1.0, 2.0}, m["layers_updated"])
		}, nil},
		{epSet, fAPI + "::TestSetSteeringThreeTier::test_prefill_with_co_located_scale", func(t *testing.T, f *forkServer) {
			set(t, f, map[string]any{"prefill_vectors": map[string]any{hp: map[string]any{"0": map[string]any{"vector": row(1, 2), "scale": 2.0}}}})
			require.InDelta(t, norm(row(2, 4)), f.normAt(t, 0, hp, "prefill_norm"), 1e-6)
		}, nil},
		{epSet, fAPI + "::TestSetSteeringThreeTier::test_decode_with_co_located_scale", func(t *testing.T, f *forkServer) {
			set(t, f, map[string]any{"decode_vectors": map[string]any{hp: map[string]any{"0": map[string]any{"vector": row(3, 6), "scale": 0.5}}}})
			require.InDelta(t, norm(row(1.5, 3)), f.normAt(t, 0, hp, "decode_norm"), 1e-6)
		}, nil},
		{epSet, fAPI + "::TestSetSteeringThreeTier::test_replace_clears_all_tiers", func(t *testing.T, f *forkServer) {
			set(t, f, map[string]any{"vectors": map[string]any{hp: map[string]any{"5": row(1)}}, "prefill_vectors": map[string]any{hp: map[string]any{"6": row(1)}}})
			set(t, f, map[string]any{"decode_vectors": map[string]any{hp: map[string]any{"0": row(1)}}, "replace": true})
			require.Equal(t, []string{"0"}, mapKeys(f.active(t)))
		}, nil},
		{epSet, fAPI + "::TestSetSteeringThreeTier::test_invalid_hook_in_prefill_tier", func(t *testing.T, f *forkServer) {
			f.fails(t, "/v1/steering/set", map[string]any{"prefill_vectors": map[string]any{"bad_hook": map[string]any{"0": row(1)}}}, 400, "Invalid hook point")
		}, nil},
		{epSet, fAPI + "::TestSetSteeringThreeTier::test_invalid_hook_in_decode_tier", func(t *testing.T, f *forkServer) {
			f.fails(t, "/v1/steering/set", map[string]any{"decode_vectors": map[string]any{"bad_hook": map[string]any{"0": row(1)}}}, 400, "Invalid hook point")
		}, nil},
		{epSet, fAPI + "::TestSetSteeringThreeTier::test_hook_points_response_includes_all_tiers", func(t *testing.T, f *forkServer) {
			m := set(t, f, map[string]any{"vectors": map[string]any{"pre_attn": map[string]any{"0": row(1)}}, "decode_vectors": map[string]any{hp: map[string]any{"0": row(1)}}})
			require.Contains(t, m["hook_points"], "pre_attn")
			require.Contains(t, m["hook_points"], hp)
		}, nil},
		{epClear, fAPI + "::TestClearSteering::test_clear", func(t *testing.T, f *forkServer) {
			set(t, f, vecs(map[string]any{"0": row(1)}))
			m := f.ok(t, "/v1/steering/clear", nil)
			require.Equal(t, "ok", m["status"])
			require.Empty(t, f.active(t))
		}, nil},
		{epGet, fAPI + "::TestGetSteering::test_get_no_active", func(t *testing.T, f *forkServer) {
			require.Equal(t, map[string]any{}, f.active(t))
		}, nil},
		{epGet, fAPI + "::TestGetSteering::test_get_active_layers", func(t *testing.T, f *forkServer) {
			set(t, f, vecs(map[string]any{"0": row(1.5), "3": row(2)}))
			a := f.active(t)
			require.Contains(t, a, "0")
			require.Contains(t, a, "3")
			require.Equal(t, map[string]any{hp: map[string]any{"norm": 1.5}}, a["0"], "only non-zero norms, under the fork's keys")
		}, nil},
		{epSet, fAPI + "::TestNormalizeSpec::test_normalize_spec_drops_empty_hook", func(t *testing.T, f *forkServer) {
			f.fails(t, "/v1/steering/set", map[string]any{"vectors": map[string]any{hp: map[string]any{}}}, 400, "No vectors provided")
		}, nil},
		{epSet, fAPI + "::TestNormalizeSpec::test_normalize_spec_drops_only_empty_hook", func(t *testing.T, f *forkServer) {
			m := set(t, f, map[string]any{"vectors": map[string]any{hp: map[string]any{"0": row(1, 2)}, "pre_attn": map[string]any{}}})
			require.Equal(t, []any{hp}, m["hook_points"])
			require.InDelta(t, norm(row(1, 2)), f.normAt(t, 0, hp, "norm"), 1e-6)
		}, nil},
		{epSet, fAPI + "::TestNormalizeSpec::test_normalize_spec_keeps_populated_hook", func(t *testing.T, f *forkServer) {
			m := set(t, f, vecs(map[string]any{"0": row(1, 2)}))
			require.Equal(t, []any{hp}, m["hook_points"])
		}, nil},
		{epRoutes, fAPI + "::TestAttachRouter::test_attached_unconditionally", func(t *testing.T, f *forkServer) {
			for _, r := range [][2]string{{"POST", "/v1/steering/set"}, {"POST", "/v1/steering/clear"}, {"GET", "/v1/steering"}} {
				code, m := f.call(t, r[0], r[1], map[string]any{})
				require.NotEqual(t, 404, code, "%s %s: %v", r[0], r[1], m)
			}
		}, nil},
	}
}

// apiAuthCases ports TestSteeringAPIKeyAuth: the write endpoints' bearer keys.
func apiAuthCases() []forkCase {
	set := forkSet
	keyed := []string{forkToken}
	bearer := "Authorization: Bearer " + forkToken
	return []forkCase{
		{epSet, fAPI + "::TestSteeringAPIKeyAuth::test_set_no_tokens_configured_is_open", func(t *testing.T, f *forkServer) {
			set(t, f, vecs(map[string]any{"0": row(1)}))
		}, nil},
		{epSet, fAPI + "::TestSteeringAPIKeyAuth::test_set_empty_tokens_configured_is_open", func(t *testing.T, f *forkServer) {
			set(t, f, vecs(map[string]any{"0": row(1)}))
		}, []string{}},
		{epSet, fAPI + "::TestSteeringAPIKeyAuth::test_set_missing_bearer_returns_401", func(t *testing.T, f *forkServer) {
			code, m := f.post(t, "/v1/steering/set", vecs(map[string]any{"0": row(1)}))
			require.Equal(t, 401, code, "%v", m)
			require.Contains(t, m["error"], "steering API key required")
			require.Empty(t, f.active(t))
		}, keyed},
		{epSet, fAPI + "::TestSteeringAPIKeyAuth::test_set_wrong_bearer_returns_401", func(t *testing.T, f *forkServer) {
			code, _ := f.post(t, "/v1/steering/set", vecs(map[string]any{"0": row(1)}), "Authorization: Bearer wrong-0123456789abcdef")
			require.Equal(t, 401, code)
			require.Empty(t, f.active(t))
		}, keyed},
		{epSet, fAPI + "::TestSteeringAPIKeyAuth::test_set_wrong_scheme_returns_401", func(t *testing.T, f *forkServer) {
			code, _ := f.post(t, "/v1/steering/set", vecs(map[string]any{"0": row(1)}), "Authorization: Basic "+forkToken)
			require.Equal(t, 401, code)
			require.Empty(t, f.active(t))
		}, keyed},
		{epSet, fAPI + "::TestSteeringAPIKeyAuth::test_set_correct_bearer_is_allowed", func(t *testing.T, f *forkServer) {
			code, m := f.post(t, "/v1/steering/set", vecs(map[string]any{"0": row(1)}), bearer)
			require.Equal(t, 200, code, "%v", m)
		}, keyed},
		{epSet, fAPI + "::TestSteeringAPIKeyAuth::test_set_accepts_any_configured_token", func(t *testing.T, f *forkServer) {
			code, m := f.post(t, "/v1/steering/set", vecs(map[string]any{"0": row(1)}), "Authorization: Bearer "+forkToken2)
			require.Equal(t, 200, code, "%v", m)
		}, []string{forkToken, forkToken2}},
		{epClear, fAPI + "::TestSteeringAPIKeyAuth::test_clear_missing_bearer_returns_401", func(t *testing.T, f *forkServer) {
			code, _ := f.post(t, "/v1/steering/clear", nil)
			require.Equal(t, 401, code)
		}, keyed},
		{epClear, fAPI + "::TestSteeringAPIKeyAuth::test_clear_correct_bearer_is_allowed", func(t *testing.T, f *forkServer) {
			code, m := f.post(t, "/v1/steering/clear", nil, bearer)
			require.Equal(t, 200, code, "%v", m)
		}, keyed},
		{epGet, fAPI + "::TestSteeringAPIKeyAuth::test_get_status_is_not_gated", func(t *testing.T, f *forkServer) {
			code, m := f.get(t, "/v1/steering")
			require.Equal(t, 200, code, "%v", m)
		}, keyed},
	}
}

// apiPackedCases ports TestSetSteeringPacked and TestSetSteeringClamps.
func apiPackedCases() []forkCase {
	set := forkSet
	return []forkCase{
		{epSet, fAPI + "::TestSetSteeringPacked::test_set_packed_base_vectors", func(t *testing.T, f *forkServer) {
			m := set(t, f, map[string]any{"vectors": map[string]any{hp: packHook(map[int][]float64{0: row(1, 2), 3: row(4, 5)}, "float32", nil)}})
			require.Equal(t, []any{0.0, 3.0}, m["layers_updated"])
			require.InDelta(t, norm(row(1, 2)), f.normAt(t, 0, hp, "norm"), 1e-6)
			require.InDelta(t, norm(row(4, 5)), f.normAt(t, 3, hp, "norm"), 1e-6)
		}, nil},
		{epSet, fAPI + "::TestSetSteeringPacked::test_set_packed_with_scales", func(t *testing.T, f *forkServer) {
			set(t, f, map[string]any{"vectors": map[string]any{hp: packHook(map[int][]float64{0: row(1, 2)}, "float32", []float64{3})}})
			require.InDelta(t, norm(row(3, 6)), f.normAt(t, 0, hp, "norm"), 1e-5)
		}, nil},
		{epSet, fAPI + "::TestSetSteeringPacked::test_set_packed_mixed_tiers", func(t *testing.T, f *forkServer) {
			set(t, f, map[string]any{"vectors": map[string]any{hp: packHook(map[int][]float64{0: row(1, 2)}, "float32", nil)},
				"prefill_vectors": map[string]any{hp: map[string]any{"0": row(0.1, 0.2)}}})
			require.InDelta(t, norm(row(1, 2)), f.normAt(t, 0, hp, "norm"), 1e-6)
			require.InDelta(t, norm(row(0.1, 0.2)), f.normAt(t, 0, hp, "prefill_norm"), 1e-6)
		}, nil},
		{epSet, fAPI + "::TestSetSteeringPacked::test_set_packed_malformed_data_length", func(t *testing.T, f *forkServer) {
			bad := map[string]any{"dtype": "float32", "shape": []int{1, 4}, "layer_indices": []int{0}, "data": base64.StdEncoding.EncodeToString(make([]byte, 8))}
			m := f.fails(t, "/v1/steering/set", map[string]any{"vectors": map[string]any{hp: bad}}, 400, "Malformed steering payload")
			require.Contains(t, m["error"], "data length 8 != expected 16")
			require.Empty(t, f.active(t))
		}, nil},
		{epSet, fAPI + "::TestSetSteeringPacked::test_set_packed_decode_only_tier", func(t *testing.T, f *forkServer) {
			set(t, f, map[string]any{"decode_vectors": map[string]any{hp: packHook(map[int][]float64{0: row(0.5, 0.6)}, "float32", nil)}})
			h := f.active(t)["0"].(map[string]any)[hp].(map[string]any)
			require.InDelta(t, norm(row(0.5, 0.6)), h["decode_norm"], 1e-6)
			require.NotContains(t, h, "norm", "no base tier")
			require.NotContains(t, h, "prefill_norm", "no prefill tier")
		}, nil},
		{epSet, fAPI + "::TestSetSteeringClamps::test_set_clamps_only_full_response", func(t *testing.T, f *forkServer) {
			m := set(t, f, map[string]any{"clamps": map[string]any{hp: map[string]any{"3": []any{map[string]any{"vector": row(1, 0), "value": 2.0}}}}})
			require.Equal(t, "ok", m["status"])
			require.Equal(t, []any{hp}, m["hook_points"])
			require.Equal(t, []any{3.0}, m["layers_updated"])
			_, g := f.get(t, "/v1/steering")
			require.Equal(t, map[string]any{"3": map[string]any{hp: 1.0}}, g["clamps"])
		}, nil},
		{epSet, fAPI + "::TestSetSteeringClamps::test_set_malformed_clamps_400", func(t *testing.T, f *forkServer) {
			m := f.fails(t, "/v1/steering/set", map[string]any{"clamps": map[string]any{hp: map[string]any{"3": []any{map[string]any{"vector": row(0, 0), "value": 1.0}}}}}, 400, "non-zero")
			require.Equal(t, "bad_clamp", m["type"])
		}, nil},
	}
}
