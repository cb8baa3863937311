package serve

import (
	"encoding/json"
	"slices"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/shmsteer/shmsteer/steer"
)

// The fork's module registry tests (tests/entrypoints/openai/test_steering_modules.py) through
// modules/register and /v1/requests/admit, and its OpenAI request-body tests
// (test_steering_protocol.py, test_steering_clamps_frontend.py) through AdmissionFromRequest.

// moduleRegistryCases ports the fork's test_steering_modules.py.
func moduleRegistryCases() []forkCase {
	return slices.Concat(moduleRegisterCases(), moduleResolveCases())
}

// forkRegister posts body to /v1/steering/modules/register and requires a 200.
func forkRegister(t *testing.T, f *forkServer, body map[string]any) map[string]any {
	t.Helper()
	return f.ok(t, "/v1/steering/modules/register", body)
}

// moduleRegisterCases ports TestSteeringModuleRegistry: modules/register and unregister.
func moduleRegisterCases() []forkCase {
	reg := fModReg + "::TestSteeringModuleRegistry::"
	register := forkRegister
	return []forkCase{
		{epModReg, reg + "test_register_and_get", func(t *testing.T, f *forkServer) {
			m := register(t, f, map[string]any{"name": "test_mod", "vectors": map[string]any{hp: map[string]any{"14": row(1, 2)}}})
			require.Equal(t, "test_mod", m["name"])
			st, ok := f.module(t, "test_mod")
			require.True(t, ok)
			require.Equal(t, row(1, 2), vectorAt(&st.Base, hp, 14))
		}, nil},
		{epModReg, reg + "test_register_overwrites_existing", func(t *testing.T, f *forkServer) {
			register(t, f, map[string]any{"name": "mod", "vectors": map[string]any{hp: map[string]any{"14": row(1)}}})
			register(t, f, map[string]any{"name": "mod", "vectors": map[string]any{"pre_attn": map[string]any{"5": row(2)}}})
			st, _ := f.module(t, "mod")
			require.NotNil(t, vectorAt(&st.Base, "pre_attn", 5))
			require.Nil(t, vectorAt(&st.Base, hp, 14))
		}, nil},
		{epModUnr, reg + "test_unregister_existing_returns_true", func(t *testing.T, f *forkServer) {
			register(t, f, map[string]any{"name": "mod", "vectors": map[string]any{hp: map[string]any{"14": row(1)}}})
			m := f.ok(t, "/v1/steering/modules/unregister", map[string]any{"name": "mod"})
			require.Equal(t, []any{}, m["modules"])
			_, ok := f.module(t, "mod")
			require.False(t, ok)
		}, nil},
		{epModUnr, reg + "test_unregister_nonexistent_returns_false", func(t *testing.T, f *forkServer) {
			m := f.fails(t, "/v1/steering/modules/unregister", map[string]any{"name": "nope"}, 404, "Steering module 'nope' not found. Available: none")
			require.Equal(t, "not_found", m["type"])
		}, nil},
		{epAdmit, reg + "test_get_nonexistent_returns_none", func(t *testing.T, f *forkServer) {
			f.fails(t, "/v1/requests/admit", map[string]any{"request_id": "r", "module": "missing"}, 404, "Unknown steering module 'missing'")
		}, nil},
		{epModReg, reg + "test_list_modules_sorted", func(t *testing.T, f *forkServer) {
			for _, n := range []string{"charlie", "alpha", "bravo"} {
				register(t, f, map[string]any{"name": n, "vectors": map[string]any{hp: map[string]any{"0": row(1)}}})
			}
			_, m := f.get(t, "/v1/steering/modules")
			require.Equal(t, []any{"alpha", "bravo", "charlie"}, m["modules"])
		}, nil},
		{epModReg, reg + "test_list_modules_empty", func(t *testing.T, f *forkServer) {
			_, m := f.get(t, "/v1/steering/modules")
			require.Equal(t, []any{}, m["modules"])
			require.EqualValues(t, 0, m["count"])
		}, nil},
		{epModReg, reg + "test_register_no_vectors_raises", func(t *testing.T, f *forkServer) {
			f.fails(t, "/v1/steering/modules/register", map[string]any{"name": "empty"}, 400, "has no vectors in any tier")
		}, nil},
		{epModReg, reg + "test_register_invalid_hook_point_raises", func(t *testing.T, f *forkServer) {
			m := f.fails(t, "/v1/steering/modules/register", map[string]any{"name": "bad_hook", "vectors": map[string]any{"totally_invalid": map[string]any{"0": row(1)}}}, 400, "Invalid hook point name")
			require.Equal(t, "unknown_hook", m["type"])
		}, nil},
		{epModReg, reg + "test_register_unknown_layer_index_raises", func(t *testing.T, f *forkServer) {
			m := f.fails(t, "/v1/steering/modules/register", map[string]any{"name": "bad_layer", "vectors": map[string]any{hp: map[string]any{"99": row(1)}}}, 400, "unknown layer index 99")
			require.Equal(t, "layer_range", m["type"])
		}, nil},
		{epModReg, reg + "test_register_malformed_entry_raises", func(t *testing.T, f *forkServer) {
			f.fails(t, "/v1/steering/modules/register", map[string]any{"name": "bad_entry", "vectors": map[string]any{hp: map[string]any{"0": "not_a_list_or_dict"}}}, 400, "got str")
		}, nil},
		{epModReg, reg + "test_register_invalid_vector_contents_raise", func(t *testing.T, f *forkServer) {
			f.fails(t, "/v1/steering/modules/register", map[string]any{"name": "bad_values", "vectors": map[string]any{hp: map[string]any{"0": map[string]any{"vector": []any{"bad", 1.0}, "scale": 1.0}}}}, 400, "must be a finite float")
			// JSON has no NaN: a scale beyond float32 is the non-finite scale a client can send.
			m := f.fails(t, "/v1/steering/modules/register", `{"name":"bad_scale","vectors":{"post_block":{"0":{"vector":[1,2,0,0,0,0,0,0],"scale":1e39}}}}`, 400, "must be finite")
			require.Equal(t, "non_finite", m["type"])
		}, nil},
		{epModReg, reg + "test_register_wrong_width_list_rejected", func(t *testing.T, f *forkServer) {
			m := f.fails(t, "/v1/steering/modules/register", map[string]any{"name": "narrow", "vectors": map[string]any{hp: map[string]any{"0": []float64{1, 2}}}}, 400, "width 2 != expected")
			require.Equal(t, "hidden_size", m["type"])
		}, nil},
		{epModReg, reg + "test_register_wrong_width_scaled_entry_rejected", func(t *testing.T, f *forkServer) {
			m := f.fails(t, "/v1/steering/modules/register", map[string]any{"name": "narrow", "prefill_vectors": map[string]any{"pre_attn": map[string]any{"1": map[string]any{"vector": []float64{1, 2, 3}, "scale": 2.0}}}}, 400, "prefill_vectors")
			require.Regexp(t, `prefill_vectors.*width 3`, m["error"])
		}, nil},
		{epModReg, reg + "test_register_wrong_width_packed_rejected", func(t *testing.T, f *forkServer) {
			f.fails(t, "/v1/steering/modules/register", map[string]any{"name": "narrow", "vectors": map[string]any{hp: packHook(map[int][]float64{0: {1, 1}}, "float32", nil)}}, 400, "width 2 != expected")
		}, nil},
		{epModReg, reg + "test_register_correct_width_accepted", func(t *testing.T, f *forkServer) {
			register(t, f, map[string]any{"name": "ok", "vectors": map[string]any{hp: map[string]any{"0": row(1, 2, 3)}}})
			_, ok := f.module(t, "ok")
			require.True(t, ok)
		}, nil},
	}
}

// moduleResolveCases ports TestResolveForRequest and TestValidateSpecRowWidths: modules named at
// admission, and row widths.
func moduleResolveCases() []forkCase {
	res := fModReg + "::TestResolveForRequest::"
	register := forkRegister
	return []forkCase{
		{epAdmit, res + "test_unknown_name_returns_error", func(t *testing.T, f *forkServer) {
			m := f.fails(t, "/v1/requests/admit", map[string]any{"request_id": "r", "module": "unknown"}, 404, "Unknown steering module")
			require.Equal(t, "not_found", m["type"])
		}, nil},
		{epAdmit, res + "test_known_name_no_inline", func(t *testing.T, f *forkServer) {
			register(t, f, map[string]any{"name": "my_mod", "vectors": map[string]any{hp: map[string]any{"14": row(1, 2)}},
				"prefill_vectors": map[string]any{"pre_attn": map[string]any{"5": row(0.5, 0.6)}}})
			f.ok(t, "/v1/requests/admit", map[string]any{"request_id": "r-known", "module": "my_mod"})
			require.Equal(t, row(1, 2), f.applied(t, "r-known", hp, 14, steer.PhaseDecode))
			require.InDeltaSlice(t, row(0.5, 0.6), f.applied(t, "r-known", "pre_attn", 5, steer.PhasePrefill), 1e-7)
			require.Equal(t, row(), f.applied(t, "r-known", "pre_attn", 5, steer.PhaseDecode), "no decode tier")
			f.ok(t, "/v1/requests/end", map[string]any{"request_id": "r-known"})
		}, nil},
		{epAdmit, res + "test_known_name_with_inline_merge", func(t *testing.T, f *forkServer) {
			register(t, f, map[string]any{"name": "base", "vectors": map[string]any{hp: map[string]any{"14": row(1, 2)}}})
			f.ok(t, "/v1/requests/admit", map[string]any{"request_id": "r-merge", "module": "base", "override": map[string]any{"vectors": map[string]any{hp: map[string]any{"14": row(0.5, 0.5)}}}})
			require.Equal(t, row(1.5, 2.5), f.applied(t, "r-merge", hp, 14, steer.PhaseDecode))
			f.ok(t, "/v1/requests/end", map[string]any{"request_id": "r-merge"})
		}, nil},
		{epAdmit, res + "test_named_one_tier_inline_different_tier", func(t *testing.T, f *forkServer) {
			register(t, f, map[string]any{"name": "named", "vectors": map[string]any{hp: map[string]any{"14": row(1, 2)}}})
			f.ok(t, "/v1/requests/admit", map[string]any{"request_id": "r-tier", "module": "named", "override": map[string]any{"prefill_vectors": map[string]any{"pre_attn": map[string]any{"5": row(0.3, 0.4)}}}})
			require.Equal(t, row(1, 2), f.applied(t, "r-tier", hp, 14, steer.PhasePrefill))
			require.InDeltaSlice(t, row(0.3, 0.4), f.applied(t, "r-tier", "pre_attn", 5, steer.PhasePrefill), 1e-7)
			require.Equal(t, row(), f.applied(t, "r-tier", "pre_attn", 5, steer.PhaseDecode), "decode tier untouched")
			f.ok(t, "/v1/requests/end", map[string]any{"request_id": "r-tier"})
		}, nil},
		{epAdmit, res + "test_error_message_lists_available_modules", func(t *testing.T, f *forkServer) {
			for _, n := range []string{"a", "b"} {
				register(t, f, map[string]any{"name": n, "vectors": map[string]any{hp: map[string]any{"0": row(1)}}})
			}
			f.fails(t, "/v1/requests/admit", map[string]any{"request_id": "r", "module": "missing"}, 404, "['a', 'b']")
		}, nil},
		{epOpenAI, fModReg + "::TestValidateSpecRowWidths::test_none_and_empty_pass", func(t *testing.T, f *forkServer) {
			_, err := AdmissionFromRequest([]byte(`{"model":"m"}`), forkCfg, OpenAIOptions{MaxClampDirections: -1})
			require.NoError(t, err)
			_, err = AdmissionFromRequest([]byte(`{"model":"m","steering_vectors":{}}`), forkCfg, OpenAIOptions{MaxClampDirections: -1})
			require.NoError(t, err)
		}, nil},
		{epOpenAI, fModReg + "::TestValidateSpecRowWidths::test_matching_widths_pass", func(t *testing.T, f *forkServer) {
			_, err := admission(t, map[string]any{"steering_vectors": map[string]any{"pre_attn": packHook(map[int][]float64{0: row(1, 2), 1: row(3, 4)}, "float32", []float64{1, 0.5})}})
			require.NoError(t, err)
		}, nil},
		{epOpenAI, fModReg + "::TestValidateSpecRowWidths::test_mismatch_names_site_and_widths", func(t *testing.T, f *forkServer) {
			_, err := admission(t, map[string]any{"steering_vectors": map[string]any{"pre_attn": packHook(map[int][]float64{1: {1, 2, 3}}, "float32", nil)}})
			require.ErrorIs(t, err, steer.ErrHiddenSize)
			require.Contains(t, err.Error(), "steering_vectors['pre_attn'][1]: vector width 3")
		}, nil},
		{epOpenAI, fModReg + "::TestValidateSpecRowWidths::test_ndarray_entry", func(t *testing.T, f *forkServer) {
			_, err := admission(t, map[string]any{"steering_vectors": map[string]any{hp: packHook(map[int][]float64{0: {1, 1, 1}}, "float32", nil)}})
			require.ErrorContains(t, err, "width 3")
		}, nil},
	}
}

// admission runs AdmissionFromRequest on a chat body with extra fields.
func admission(t *testing.T, extra map[string]any) (AdmitRequest, error) {
	t.Helper()
	return admissionOf(t, chatBody, extra, -1)
}

var (
	chatBody       = map[string]any{"messages": []any{map[string]any{"role": "user", "content": "Hello"}}, "model": "test-model"}
	completionBody = map[string]any{"prompt": "Hello", "model": "test-model"}
)

func admissionOf(t *testing.T, base, extra map[string]any, maxClamps int) (AdmitRequest, error) {
	t.Helper()
	body := map[string]any{}
	for k, v := range base {
		body[k] = v
	}
	for k, v := range extra {
		body[k] = v
	}
	b, err := json.Marshal(body)
	require.NoError(t, err)
	return AdmissionFromRequest(b, forkCfg, OpenAIOptions{MaxClampDirections: maxClamps})
}

// overrideOf parses an admission's override into steering.
func overrideOf(t *testing.T, a AdmitRequest) steer.Steering {
	t.Helper()
	require.NotNil(t, a.Override)
	st, err := a.Override.Steering(forkCfg)
	require.NoError(t, err)
	return st
}

// openAICases ports the fork's test_steering_protocol.py and test_steering_clamps_frontend.py.
func openAICases() []forkCase {
	return slices.Concat(openAIBodyCases(), openAINameCases(), openAIClampCases(), openAIClampGateCases())
}

// filledRow is a row of forkHidden floats, each v.
func filledRow(v float64) []float64 {
	r := make([]float64, forkHidden)
	for i := range r {
		r[i] = v
	}
	return r
}

// packedRow is a packed float32 hook entry: filledRow(v) at layer.
func packedRow(layer int, v float64) map[string]any {
	return packHook(map[int][]float64{layer: filledRow(v)}, "float32", nil)
}

// clampEntry is one clamp direction of width hidden along axis (length 2: the server
// normalizes) with value.
func clampEntry(axis int, value float64, hidden int) map[string]any {
	v := make([]float64, hidden)
	v[axis] = 2 // non-unit on purpose: the server normalizes
	return map[string]any{"vector": v, "value": value}
}

// clampAt is a clamp spec with one direction of width hidden at post_block, layer.
func clampAt(layer string, hidden int) map[string]any {
	return map[string]any{hp: map[string]any{layer: []any{clampEntry(0, 2, hidden)}}}
}

// openAIBodyCases ports TestChatCompletionSteering and TestCompletionSteering: the packed
// steering fields of chat and completion bodies.
func openAIBodyCases() []forkCase {
	fill := filledRow
	basePacked := map[string]any{"pre_attn": packedRow(15, 0.1)}
	prefillPacked := map[string]any{"pre_attn": packedRow(15, 0.7)}
	decodePacked := map[string]any{"post_attn": packedRow(20, 1.0)}
	var out []forkCase
	for _, kind := range []struct {
		class string
		body  map[string]any
	}{{"TestChatCompletionSteering", chatBody}, {"TestCompletionSteering", completionBody}} {
		p := fOpenAI + "::" + kind.class + "::"
		body := kind.body
		out = append(out,
			forkCase{epOpenAI, p + "test_no_steering_fields", func(t *testing.T, f *forkServer) {
				a, err := admissionOf(t, body, nil, -1)
				require.NoError(t, err)
				require.Nil(t, a.Override)
			}, nil},
			forkCase{epOpenAI, p + "test_packed_steering_vectors", func(t *testing.T, f *forkServer) {
				a, err := admissionOf(t, body, map[string]any{"steering_vectors": basePacked}, -1)
				require.NoError(t, err)
				st := overrideOf(t, a)
				require.InDeltaSlice(t, fill(0.1), vectorAt(&st.Base, "pre_attn", 15), 1e-7)
			}, nil},
			forkCase{epOpenAI, p + "test_packed_prefill_steering_vectors", func(t *testing.T, f *forkServer) {
				a, err := admissionOf(t, body, map[string]any{"prefill_steering_vectors": prefillPacked}, -1)
				require.NoError(t, err)
				st := overrideOf(t, a)
				require.InDeltaSlice(t, fill(0.7), vectorAt(&st.Prefill, "pre_attn", 15), 1e-7)
			}, nil},
			forkCase{epOpenAI, p + "test_packed_decode_steering_vectors", func(t *testing.T, f *forkServer) {
				a, err := admissionOf(t, body, map[string]any{"decode_steering_vectors": decodePacked}, -1)
				require.NoError(t, err)
				st := overrideOf(t, a)
				require.Equal(t, fill(1), vectorAt(&st.Decode, "post_attn", 20))
			}, nil},
			forkCase{epOpenAI, p + "test_all_three_tiers", func(t *testing.T, f *forkServer) {
				a, err := admissionOf(t, body, map[string]any{"steering_vectors": basePacked, "prefill_steering_vectors": prefillPacked, "decode_steering_vectors": decodePacked}, -1)
				require.NoError(t, err)
				st := overrideOf(t, a)
				require.Len(t, st.Base.Vectors, 1)
				require.Len(t, st.Prefill.Vectors, 1)
				require.Len(t, st.Decode.Vectors, 1)
			}, nil},
			forkCase{epOpenAI, p + "test_legacy_list_of_floats_rejected", func(t *testing.T, f *forkServer) {
				_, err := admissionOf(t, body, map[string]any{"steering_vectors": map[string]any{"pre_attn": map[string]any{"15": []float64{0.1, 0.2, 0.3}}}}, -1)
				require.ErrorIs(t, err, ErrBadInput)
				require.ErrorContains(t, err, "Field required")
			}, nil},
			forkCase{epOpenAI, p + "test_legacy_scaled_dict_rejected", func(t *testing.T, f *forkServer) {
				_, err := admissionOf(t, body, map[string]any{"steering_vectors": map[string]any{hp: map[string]any{"10": map[string]any{"vector": []float64{0.4, 0.5, 0.6}, "scale": 2.0}}}}, -1)
				require.ErrorIs(t, err, ErrBadInput)
			}, nil},
			forkCase{epOpenAI, p + "test_to_sampling_params_unpacks_all_fields", func(t *testing.T, f *forkServer) {
				// End to end: the translation is admitted by serve and a worker applies it.
				a, err := admissionOf(t, body, map[string]any{"steering_vectors": basePacked, "prefill_steering_vectors": prefillPacked, "decode_steering_vectors": decodePacked}, -1)
				require.NoError(t, err)
				a.RequestID = "oa-" + kind.class
				f.ok(t, "/v1/requests/admit", a)
				require.InDeltaSlice(t, fill(0.1+0.7), f.applied(t, a.RequestID, "pre_attn", 15, steer.PhasePrefill), 1e-6)
				require.InDeltaSlice(t, fill(0.1), f.applied(t, a.RequestID, "pre_attn", 15, steer.PhaseDecode), 1e-6)
				require.Equal(t, fill(1), f.applied(t, a.RequestID, "post_attn", 20, steer.PhaseDecode))
				f.ok(t, "/v1/requests/end", map[string]any{"request_id": a.RequestID})
			}, nil},
			forkCase{epOpenAI, p + "test_to_sampling_params_none_when_absent", func(t *testing.T, f *forkServer) {
				a, err := admissionOf(t, body, map[string]any{"steering_vectors": nil}, -1)
				require.NoError(t, err)
				require.Nil(t, a.Override)
			}, nil},
			forkCase{epOpenAI, p + "test_per_row_scales_applied_at_unpack", func(t *testing.T, f *forkServer) {
				a, err := admissionOf(t, body, map[string]any{"steering_vectors": map[string]any{hp: packHook(map[int][]float64{10: fill(1)}, "float32", []float64{2})}}, -1)
				require.NoError(t, err)
				st := overrideOf(t, a)
				require.Equal(t, fill(2), vectorAt(&st.Base, hp, 10))
			}, nil},
		)
	}
	return out
}

// openAINameCases ports TestSteeringNameField: steering_name and conversation_id.
func openAINameCases() []forkCase {
	n := fOpenAI + "::TestSteeringNameField::"
	basePacked := map[string]any{"pre_attn": packedRow(15, 0.1)}
	return []forkCase{
		forkCase{epOpenAI, n + "test_chat_completion_steering_name_field", func(t *testing.T, f *forkServer) {
			a, err := admissionOf(t, chatBody, nil, -1)
			require.NoError(t, err)
			require.Empty(t, a.Module)
			a, err = admissionOf(t, chatBody, map[string]any{"steering_name": "creativity"}, -1)
			require.NoError(t, err)
			require.Equal(t, "creativity", a.Module)
		}, nil},
		forkCase{epOpenAI, n + "test_completion_steering_name_field", func(t *testing.T, f *forkServer) {
			a, err := admissionOf(t, completionBody, map[string]any{"steering_name": "safety"}, -1)
			require.NoError(t, err)
			require.Equal(t, "safety", a.Module)
		}, nil},
		forkCase{epOpenAI, n + "test_steering_name_coexists_with_inline_vectors", func(t *testing.T, f *forkServer) {
			a, err := admissionOf(t, chatBody, map[string]any{"steering_name": "base_personality", "steering_vectors": basePacked}, -1)
			require.NoError(t, err)
			require.Equal(t, "base_personality", a.Module)
			require.NotNil(t, a.Override)
		}, nil},
		forkCase{epOpenAI, n + "test_conversation_id_defaults_none", func(t *testing.T, f *forkServer) {
			for _, b := range []map[string]any{chatBody, completionBody} {
				a, err := admissionOf(t, b, nil, -1)
				require.NoError(t, err)
				require.Empty(t, a.Conversation)
			}
		}, nil},
		forkCase{epOpenAI, n + "test_conversation_id_not_on_sampling_params", func(t *testing.T, f *forkServer) {
			a, err := admissionOf(t, chatBody, map[string]any{"conversation_id": "conv-7"}, -1)
			require.NoError(t, err)
			require.Nil(t, a.Override, "the conversation is admission metadata, not steering")
		}, nil},
		forkCase{epOpenAI, n + "test_conversation_id_threads_to_request_metadata", func(t *testing.T, f *forkServer) {
			a, err := admissionOf(t, chatBody, map[string]any{"conversation_id": "conv-7"}, -1)
			require.NoError(t, err)
			require.Equal(t, "conv-7", a.Conversation)
			a, err = admissionOf(t, completionBody, map[string]any{"conversation_id": "conv-9"}, -1)
			require.NoError(t, err)
			require.Equal(t, "conv-9", a.Conversation)
		}, nil},
		forkCase{epOpenAI, n + "test_conversation_id_none_when_absent", func(t *testing.T, f *forkServer) {
			a, err := admissionOf(t, chatBody, map[string]any{"conversation_id": nil}, -1)
			require.NoError(t, err)
			require.Equal(t, AdmitRequest{}, a, "an empty admission")
		}, nil},
	}
}

// openAIClampCases ports the clamp frontend's ingestion and protocol tests: steering_clamps in
// OpenAI bodies.
func openAIClampCases() []forkCase {
	c := fClamps + "::"
	entry := clampEntry
	clamps := clampAt
	return []forkCase{
		forkCase{epOpenAI, c + "TestFromObjIngestionShapes::test_none_and_empty", func(t *testing.T, f *forkServer) {
			for _, v := range []any{nil, map[string]any{}} {
				a, err := admissionOf(t, chatBody, map[string]any{"steering_clamps": v}, -1)
				require.NoError(t, err)
				require.Nil(t, a.Override)
			}
		}, nil},
		forkCase{epOpenAI, c + "TestFromObjIngestionShapes::test_string_layer_keys_coerced", func(t *testing.T, f *forkServer) {
			a, err := admissionOf(t, chatBody, map[string]any{"steering_clamps": clamps("5", forkHidden)}, -1)
			require.NoError(t, err)
			st := overrideOf(t, a)
			require.Equal(t, 5, st.Base.Clamps[0].Layer)
		}, nil},
		forkCase{epOpenAI, c + "TestFromObjIngestionShapes::test_int_layer_keys_pass_through", func(t *testing.T, f *forkServer) {
			// JSON keys are strings: an integer key arrives as "5" (the packed form names
			// layers as integers).
			r := make([]float64, forkHidden)
			r[0] = 1
			a, err := admissionOf(t, chatBody, map[string]any{"steering_clamps": map[string]any{hp: map[string]any{
				"dtype": "float64", "shape": []int{1, forkHidden}, "layer_indices": []int{5}, "data": packHook(map[int][]float64{0: r}, "float64", nil)["data"],
				"bounds": []any{[]any{2.0, 2.0}}, "strengths": []float64{1}}}}, -1)
			require.NoError(t, err)
			require.Equal(t, 5, overrideOf(t, a).Base.Clamps[0].Layer)
		}, nil},
		forkCase{epOpenAI, c + "TestFromObjIngestionShapes::test_bad_layer_key_raises", func(t *testing.T, f *forkServer) {
			_, err := admissionOf(t, chatBody, map[string]any{"steering_clamps": map[string]any{hp: map[string]any{"abc": []any{entry(0, 2, forkHidden)}}}}, -1)
			require.ErrorContains(t, err, "layer index")
			require.NotContains(t, err.Error(), "Malformed", "per-request errors are worded as the fork's SamplingParams")
		}, nil},
		forkCase{epOpenAI, c + "TestFromObjIngestionShapes::test_non_dict_hook_value_raises", func(t *testing.T, f *forkServer) {
			_, err := admissionOf(t, chatBody, map[string]any{"steering_clamps": map[string]any{hp: []any{entry(0, 2, forkHidden)}}}, -1)
			require.ErrorContains(t, err, "must map")
		}, nil},
		forkCase{epOpenAI, c + "TestChatProtocolClamps::test_fields_default_none", func(t *testing.T, f *forkServer) {
			a, err := admissionOf(t, chatBody, nil, -1)
			require.NoError(t, err)
			require.Nil(t, a.Override)
		}, nil},
		forkCase{epOpenAI, c + "TestChatProtocolClamps::test_to_sampling_params_coerces_and_normalizes", func(t *testing.T, f *forkServer) {
			a, err := admissionOf(t, chatBody, map[string]any{"steering_clamps": clamps("5", forkHidden),
				"decode_steering_clamps": map[string]any{hp: map[string]any{"6": []any{entry(1, 3, forkHidden)}}}}, -1)
			require.NoError(t, err)
			st := overrideOf(t, a)
			require.Equal(t, 5, st.Base.Clamps[0].Layer)
			require.Equal(t, float32(2), st.Base.Clamps[0].Min)
			require.Equal(t, float32(2), st.Base.Clamps[0].Max)
			require.Equal(t, 6, st.Decode.Clamps[0].Layer)
			require.Empty(t, st.Prefill.Clamps)
			// steer normalizes the direction when it composes: admitted as is.
			a.RequestID = "oa-clamp"
			f.ok(t, "/v1/requests/admit", a)
			f.ok(t, "/v1/requests/end", map[string]any{"request_id": "oa-clamp"})
		}, nil},
		forkCase{epOpenAI, c + "TestChatProtocolClamps::test_invalid_entry_rejected_at_sampling_params", func(t *testing.T, f *forkServer) {
			_, err := admissionOf(t, chatBody, map[string]any{"steering_clamps": map[string]any{hp: map[string]any{"5": []any{map[string]any{"vector": make([]float64, forkHidden), "value": 1.0}}}}}, -1)
			require.ErrorIs(t, err, steer.ErrBadClamp)
			require.ErrorContains(t, err, "zero")
		}, nil},
		forkCase{epOpenAI, c + "TestCompletionProtocolClamps::test_to_sampling_params_coerces", func(t *testing.T, f *forkServer) {
			a, err := admissionOf(t, completionBody, map[string]any{"steering_clamps": clamps("7", forkHidden)}, -1)
			require.NoError(t, err)
			require.Equal(t, 7, overrideOf(t, a).Base.Clamps[0].Layer)
		}, nil},
	}
}

// openAIClampGateCases ports the clamp frontend's registry and input-processor tests: clamps in
// modules, and max_clamp_directions.
func openAIClampGateCases() []forkCase {
	c := fClamps + "::"
	entry := clampEntry
	clamps := clampAt
	fill := filledRow
	return []forkCase{
		forkCase{epModReg, c + "TestRegistryClamps::test_register_clamp_only_module", func(t *testing.T, f *forkServer) {
			f.ok(t, "/v1/steering/modules/register", map[string]any{"name": "c", "clamps": clamps("5", forkHidden)})
			st, ok := f.module(t, "c")
			require.True(t, ok)
			require.Equal(t, 5, st.Base.Clamps[0].Layer)
		}, nil},
		forkCase{epModReg, c + "TestRegistryClamps::test_dump_for_broadcast_carries_clamps", func(t *testing.T, f *forkServer) {
			f.ok(t, "/v1/steering/modules/register", map[string]any{"name": "c", "clamps": clamps("5", forkHidden),
				"decode_clamps": map[string]any{hp: map[string]any{"6": []any{entry(1, 0, forkHidden)}}}})
			st, _ := f.module(t, "c")
			require.Len(t, st.Base.Clamps, 1)
			require.Len(t, st.Decode.Clamps, 1)
			require.Empty(t, st.Prefill.Clamps)
			require.Empty(t, st.Base.Vectors)
		}, nil},
		forkCase{epModReg, c + "TestRegistryClamps::test_empty_module_rejected", func(t *testing.T, f *forkServer) {
			f.fails(t, "/v1/steering/modules/register", map[string]any{"name": "empty"}, 400, "no clamps")
		}, nil},
		forkCase{epModReg, c + "TestRegistryClamps::test_wrong_width_clamp_rejected", func(t *testing.T, f *forkServer) {
			m := f.fails(t, "/v1/steering/modules/register", map[string]any{"name": "c", "clamps": clamps("5", 4)}, 400, "width")
			require.Equal(t, "hidden_size", m["type"])
		}, nil},
		forkCase{epModReg, c + "TestRegistryClamps::test_malformed_entry_rejected", func(t *testing.T, f *forkServer) {
			f.fails(t, "/v1/steering/modules/register", map[string]any{"name": "c", "clamps": map[string]any{hp: map[string]any{"5": []any{map[string]any{"vector": fill(1)}}}}}, 400, "at least one")
		}, nil},
		forkCase{epModReg, c + "TestRegistryClamps::test_invalid_hook_rejected", func(t *testing.T, f *forkServer) {
			f.fails(t, "/v1/steering/modules/register", map[string]any{"name": "c", "clamps": map[string]any{"bogus": map[string]any{"5": []any{entry(0, 2, forkHidden)}}}}, 400, "hook point")
		}, nil},
		forkCase{epOpenAI, c + "TestInputProcessorClampGates::test_clamps_rejected_when_clamping_disabled", func(t *testing.T, f *forkServer) {
			_, err := admissionOf(t, chatBody, map[string]any{"steering_clamps": clamps("5", forkHidden)}, 0)
			require.ErrorContains(t, err, "max_clamp_directions")
		}, nil},
		forkCase{epOpenAI, c + "TestInputProcessorClampGates::test_clamps_accepted_when_enabled", func(t *testing.T, f *forkServer) {
			_, err := admissionOf(t, chatBody, map[string]any{"steering_clamps": clamps("5", forkHidden)}, -1)
			require.NoError(t, err)
		}, nil},
		forkCase{epOpenAI, c + "TestInputProcessorClampGates::test_wrong_width_rejected", func(t *testing.T, f *forkServer) {
			_, err := admissionOf(t, chatBody, map[string]any{"steering_clamps": clamps("5", 16)}, -1)
			require.ErrorContains(t, err, "width")
		}, nil},
		forkCase{epOpenAI, c + "TestInputProcessorClampGates::test_per_site_k_cap_enforced", func(t *testing.T, f *forkServer) {
			_, err := admissionOf(t, chatBody, map[string]any{
				"steering_clamps":        map[string]any{hp: map[string]any{"5": []any{entry(0, 2, forkHidden), entry(1, 2, forkHidden)}}},
				"decode_steering_clamps": map[string]any{hp: map[string]any{"5": []any{entry(2, 2, forkHidden)}}}}, 2)
			require.ErrorContains(t, err, "max_clamp_directions")
			require.ErrorContains(t, err, "Clamp spec ['post_block'][5] has 3 directions")
		}, nil},
		forkCase{epOpenAI, c + "TestInputProcessorClampGates::test_vectors_plus_clamps_ok", func(t *testing.T, f *forkServer) {
			a, err := admissionOf(t, chatBody, map[string]any{"steering_vectors": map[string]any{hp: packHook(map[int][]float64{5: fill(1)}, "float32", nil)},
				"steering_clamps": clamps("5", forkHidden)}, -1)
			require.NoError(t, err)
			st := overrideOf(t, a)
			require.Len(t, st.Base.Vectors, 1)
			require.Len(t, st.Base.Clamps, 1)
		}, nil},
	}
}

const (
	engineOnly  = "needs a model engine: the fork's test makes its mocked engine raise or report no layers; serve has no model engine behind it"
	prefixCache = "the prefix-cache reset is the model server's (serve holds no KV cache)"
	pyHelper    = "tests a Python helper of the fork with no HTTP surface"
	moduleFiles = "the fork's JSON module-file loader; serve has no module files (modules are registered through the API and persisted in --state-dir)"
)

// forkLeftOut lists every fork test not ported, with the reason.
var forkLeftOut = []leftOutCase{
	{epSet, fAPI + "::TestSetSteeringBase::test_set_no_steerable_layers", engineOnly + " (every layer of serve's model is steerable)"},
	{epSet, fAPI + "::TestSetSteeringBase::test_set_runtime_error_returns_500", engineOnly},
	{epClear, fAPI + "::TestClearSteering::test_clear_engine_error", engineOnly},
	{epClear, fAPI + "::TestClearSteering::test_clear_cache_reset_failure_returns_503", prefixCache},
	{epSet, fAPI + "::TestSetSteeringCacheInvalidation::test_base_vectors_cache_failure_returns_503", prefixCache},
	{epSet, fAPI + "::TestSetSteeringCacheInvalidation::test_decode_only_cache_failure_returns_503", prefixCache},
	{epSet, fAPI + "::TestSetSteeringCacheInvalidation::test_cache_success_returns_200", prefixCache},
	{epGet, fAPI + "::TestGetSteering::test_get_merges_multiple_workers", "needs several pipeline-parallel workers reporting disjoint layers; serve reads one region"},
	{epGet, fAPI + "::TestGetSteering::test_get_engine_error", engineOnly},
	{epSet, fProtocol + "::TestSetSteeringRequest::test_all_fields_none_by_default", "pydantic model defaults; the HTTP behaviour of an empty body is test_set_empty_all_tiers"},
	{epModReg, fModReg + "::TestSteeringModuleRegistry::test_register_no_width_configured_is_permissive", "serve always knows the model's width and refuses other widths (deliberate: the fork's registry without a width lets a wrong width reach the workers)"},
	{epAdmit, fModReg + "::TestResolveForRequest::test_dimension_mismatch_returns_error", "cannot arise: serve checks every width against the model before composing (a 2-wide module next to a 1-wide inline vector is refused at registration or admission)"},
	{epModReg, fModReg + "::test_init_app_state_only_sets_registry_when_steering_enabled", "the fork's app-state wiring of --enable-steering; serve always has the registry"},
	{epOpenAI, fClamps + "::TestInputProcessorClampGates::test_clamps_rejected_when_steering_disabled", "serve has no steering-disabled mode (the fork's --enable-steering)"},
}

func init() {
	for _, n := range []string{"test_both_none_returns_none", "test_both_empty_returns_none", "test_first_none_second_has_data", "test_first_has_data_second_none",
		"test_non_overlapping_hooks_both_preserved", "test_non_overlapping_layers_same_hook", "test_overlapping_hook_layer_added",
		"test_overlapping_with_scaled_entries", "test_one_scaled_one_bare", "test_passthrough_entry_is_prescaled"} {
		forkLeftOut = append(forkLeftOut, forkLeftOut1(epAdmit, fModReg+"::TestMergeSteeringSpecs::"+n, pyHelper+" (merge_steering_specs; module + inline composition is covered by the TestResolveForRequest ports)"))
	}
	for _, n := range []string{"test_none_returns_none", "test_empty_dict_returns_none", "test_converts_string_keys_to_int", "test_rejects_non_dict_layers", "test_rejects_non_dict_spec"} {
		forkLeftOut = append(forkLeftOut, forkLeftOut1(epModReg, fModReg+"::TestConvertLayerKeys::"+n, pyHelper+" (_convert_layer_keys of the module-file loader)"))
	}
	for _, n := range []string{"test_load_from_file_valid_json", "test_load_from_file_missing_raises", "test_load_from_file_converts_string_keys", "test_load_from_file_non_dict_raises",
		"test_load_from_file_invalid_vector_contents_raise", "test_load_from_file_rejects_non_dict_hook_payload", "test_load_from_file_packed_tier",
		"test_load_from_file_packed_with_scales", "test_load_from_file_packed_malformed_raises"} {
		forkLeftOut = append(forkLeftOut, forkLeftOut1(epModReg, fModReg+"::TestSteeringModuleRegistry::"+n, moduleFiles))
	}
}

func forkLeftOut1(ep, fork, reason string) leftOutCase { return leftOutCase{ep, fork, reason} }

// FuzzAdmissionFromRequest feeds arbitrary OpenAI bodies through the translation: no panic, and
// an accepted body's override parses again (as serve's admit parses it) to the same steering.
func FuzzAdmissionFromRequest(f *testing.F) {
	p := packHook(map[int][]float64{1: row(1, 2)}, "float32", []float64{2})
	seed, _ := json.Marshal(map[string]any{"model": "m", "prompt": "x", "steering_vectors": map[string]any{hp: p},
		"decode_steering_clamps": map[string]any{hp: map[string]any{"2": []any{map[string]any{"vector": row(1), "min": -1, "max": 1}}}},
		"steering_name":          "mod", "conversation_id": "c"})
	f.Add(seed)
	f.Add([]byte(`{"steering_clamps":{"post_block":{"dtype":"float16","shape":[1,8],"layer_indices":[0],"data":"ADwAPAA8ADwAPAA8ADwAPA==","bounds":[[null,1]],"strengths":[0.5]}}}`))
	f.Add([]byte(`{"steering_clamps":{"hooks":{"post_block":{"shape":[1,8],"layer_indices":[3],"data":"AAAAAAAA8D8AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA","lo":[null],"hi":[2],"strength":[1]}}}}`))
	f.Add([]byte(`{"steering":[{"when":{"kind":"always"}}]}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		a, err := AdmissionFromRequest(b, forkCfg, OpenAIOptions{MaxClampDirections: -1})
		if err != nil {
			noDecoderInternals(t, err)
			return
		}
		if a.Override == nil {
			return
		}
		st, err := a.Override.Steering(forkCfg)
		if err != nil {
			t.Fatalf("an accepted override does not parse again: %v", err)
		}
		if st.Empty() {
			t.Fatal("an override that steers nothing was returned")
		}
		enc, d, err := steer.EncodeSteering(&st, forkCfg)
		if err != nil {
			return // steer's own checks (layer range, magnitude) run at admission
		}
		if _, d2, err := steer.DecodeSteering(enc, forkCfg); err != nil || d != d2 {
			t.Fatalf("accepted steering does not round-trip: %v", err)
		}
	})
}
