"""The exceptions of :mod:`shmsteer.vllm` (the engine's own errors stay in :mod:`shmsteer.errors`)."""

from __future__ import annotations

from ..errors import ShmsteerError

__all__ = ["VllmPluginError", "BatchLayoutError", "UnsupportedModelError", "CompiledModelError",
           "CudaGraphModeError", "SitesNotAttachedError", "PluginConfigError"]


class VllmPluginError(ShmsteerError):
    """Base of the vLLM plugin's errors."""


class BatchLayoutError(VllmPluginError, ValueError):
    """A runner's batch arrays do not describe a layout of the step's rows (lengths differ,
    offsets decrease, rows past the hidden states)."""


class UnsupportedModelError(VllmPluginError, TypeError):
    """The loaded model has no decoder layers the plugin knows how to steer (the Llama, Qwen2,
    Qwen3 and Mistral families: ``model.model.layers`` of layers with ``post_attention_layernorm``
    and ``mlp``), or its hidden size or layer count differ from the owner's model config."""


class CompiledModelError(VllmPluginError, RuntimeError):
    """Base of the errors of a compiled model the plugin cannot steer (one subclass per failure)."""


class CudaGraphModeError(CompiledModelError):
    """The model runs CUDA graphs: a replay would skip the plugin's operator. Start vLLM with
    ``compilation_config={"cudagraph_mode": "NONE"}`` (``-cc.cudagraph_mode=NONE``) or
    ``--enforce-eager``."""


class SitesNotAttachedError(CompiledModelError):
    """The model is compiled but the plugin's compiled sites were not attached before vLLM traced
    it (a runner whose ``load_model`` the plugin does not wrap): steering would be skipped. Run
    it with ``-O0 --enforce-eager``."""


class PluginConfigError(VllmPluginError, ValueError):
    """An ``SHMSTEER_VLLM_*`` setting is invalid."""
