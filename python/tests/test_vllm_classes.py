"""shmsteer.vllm against vLLM's own classes (no engine): OpenAI requests' vllm_xargs through
vLLM's protocol into SamplingParams.extra_args and into an admission, and the plugin's patches
of vLLM's scheduler, input processor and both model runners, installed once.

Skipped with the reason when vLLM is not importable in the running interpreter (the project's
test venv has none; .ci/pyenv-vllm makes one that has it, see docs/vllm.md)."""

from __future__ import annotations

import base64
import importlib.util
import json
import struct

import pytest

NO_VLLM = "vllm is not importable in this interpreter (bash .ci/pyenv-vllm makes one that has it; docs/vllm.md)"
pytestmark = pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason=NO_VLLM)

HIDDEN = 16
MODEL = (HIDDEN, 4, ["pre_attn", "post_attn", "post_block", "mlp_in", "mlp_out"])


def blob(layer: int, width: int = HIDDEN) -> dict:
    raw = struct.pack(f"<{width}f", *([0.25] * width))
    return {"dtype": "float32", "shape": [1, width], "layer_indices": [layer],
            "data": base64.b64encode(raw).decode("ascii")}


def test_openai_vllm_xargs_reach_an_admission():
    from vllm.entrypoints.openai.completion.protocol import CompletionRequest
    from shmsteer.vllm.requests import admission_for
    req = CompletionRequest(model="m", prompt=[1, 2, 3], max_tokens=4, vllm_xargs={
        "steering_vectors": json.dumps({"post_block": blob(2)}), "conversation_id": "chat-7",
        "capture": json.dumps({"fs": {"request_id": "r", "hooks": {"post_block": [2]}, "positions": "all"}})})
    sp = req.to_sampling_params(max_tokens=4)
    kw = admission_for(sp.extra_args, 3, MODEL)
    assert kw["conversation"] == "chat-7" and kw["prompt_len"] == 3
    assert list(kw["override"]["base"]["vectors"][0]["data"]) == [0.25] * HIDDEN


def test_chat_vllm_xargs_refusal_is_a_value_error():
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
    from shmsteer.openai import SteeringRequestError
    from shmsteer.vllm.requests import admission_for
    req = ChatCompletionRequest(model="m", messages=[{"role": "user", "content": "hi"}], vllm_xargs={
        "steering_vectors": json.dumps({"post_block": blob(2, width=8)})})
    sp = req.to_sampling_params(max_tokens=4, default_sampling_params={})
    with pytest.raises(SteeringRequestError, match="model hidden size") as e:
        admission_for(sp.extra_args, 1, MODEL)
    assert isinstance(e.value, ValueError) and e.value.status == 400  # vLLM's server answers ValueError with 400


def test_sampling_params_extra_args_decoded_offline():
    from vllm import SamplingParams
    from shmsteer.vllm.requests import admission_for
    sp = SamplingParams(max_tokens=2, extra_args={"steering_vectors": {"mlp_out": blob(1)}})
    assert admission_for(sp.extra_args, 5, MODEL)["override"]["base"]["vectors"][0]["hook"] == "mlp_out"
    assert admission_for(SamplingParams(max_tokens=2).extra_args, 5, MODEL) is None


def test_register_patches_vllm_once(monkeypatch):
    monkeypatch.setenv("SHMSTEER_VLLM", "1")
    import shmsteer.vllm as plugin
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.engine.input_processor import InputProcessor
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner
    plugin.register()
    first = (Scheduler.add_request, Scheduler._free_request, InputProcessor._validate_params,
             GPUModelRunner._model_forward)
    monkeypatch.setattr(plugin, "_registered", False)
    plugin.register()  # a second load of the plugin in one process wraps nothing twice
    assert (Scheduler.add_request, Scheduler._free_request, InputProcessor._validate_params,
            GPUModelRunner._model_forward) == first
    assert Scheduler._shmsteer_patched and GPUModelRunner._shmsteer_patched
    try:
        from vllm.v1.worker.gpu.model_runner import GPUModelRunner as V2
    except ImportError as e:
        pytest.skip(f"the V2 runner does not import here: {e}")
    assert V2._shmsteer_patched


def test_compile_mode_of_vllm_configs(monkeypatch):
    """vLLM's own CompilationConfig: a Dynamo mode is compiled, CUDA graphs are refused without
    static mode and turn it on by default."""
    from shmsteer.vllm.static import static_mode
    monkeypatch.delenv("SHMSTEER_VLLM_STATIC", raising=False)
    from vllm.config import CompilationConfig
    from shmsteer.vllm import CudaGraphModeError
    from shmsteer.vllm.worker import compile_mode

    class Cfg:
        def __init__(self, **kw):
            self.compilation_config = CompilationConfig(**kw)

    assert compile_mode(Cfg(mode=0, cudagraph_mode="NONE")) is False
    assert compile_mode(Cfg(mode=3, cudagraph_mode="NONE")) is True
    assert not static_mode(Cfg(mode=3, cudagraph_mode="NONE"))
    assert static_mode(Cfg(mode=3, cudagraph_mode="PIECEWISE")) and static_mode(Cfg(mode=3, cudagraph_mode="FULL"))
    assert compile_mode(Cfg(mode=3, cudagraph_mode="PIECEWISE")) is True
    monkeypatch.setenv("SHMSTEER_VLLM_STATIC", "0")
    with pytest.raises(CudaGraphModeError):
        compile_mode(Cfg(mode=3, cudagraph_mode="PIECEWISE"))


def test_frontend_refuses_a_gate_the_owner_refuses(monkeypatch):
    """The patched InputProcessor._validate_params runs the owner's gate check (the C ABI's):
    attenuate with a this_token probe raises the engine's GateUnsupportedError, also vLLM's
    VLLMValidationError (its OpenAI server answers 400 with the text; LLM.generate raises it); a
    malformed gate raises BadGateError; an accepted gate and no gates pass."""
    from types import SimpleNamespace
    from vllm import SamplingParams
    from vllm.exceptions import VLLMValidationError
    from vllm.v1.engine.input_processor import InputProcessor
    from shmsteer import errors
    from shmsteer.vllm import engine
    monkeypatch.setattr(InputProcessor, "_validate_params", lambda self, params, *a, **k: None)
    monkeypatch.setattr(InputProcessor, "_shmsteer_patched", False, raising=False)
    engine.patch_frontend()
    proc = SimpleNamespace(model_config=SimpleNamespace(hf_text_config=SimpleNamespace(hidden_size=HIDDEN,
                                                                                       num_hidden_layers=4)),
                           vllm_config=None)
    probe = {"kind": "probe", "probe": {"kind": "name", "name": "p"}, "threshold": 0.0}
    attenuate = {"kind": "attenuate", "strength": 0.5}

    def validate(gates):
        InputProcessor._validate_params(proc, SamplingParams(max_tokens=2, extra_args={"steering": json.dumps(gates)}))

    with pytest.raises(errors.GateUnsupportedError) as e:
        validate([{"when": probe, "scope": "this_token", "apply": attenuate}])
    assert isinstance(e.value, VLLMValidationError)
    assert str(e.value).startswith("steering[0]: shmsteer: unsupported steering gate: attenuate with when=probe")
    with pytest.raises(errors.BadGateError, match="scope: \"forever\" is not one of") as e:
        validate([{"when": probe, "scope": "forever", "apply": attenuate}])
    assert isinstance(e.value, VLLMValidationError)
    validate([{"when": probe, "scope": "next_step", "apply": attenuate}])
    validate([])
    InputProcessor._validate_params(proc, SamplingParams(max_tokens=2))
