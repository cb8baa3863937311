"""The exceptions of :mod:`shmsteer.vllm` (the engine's own errors stay in :mod:`shmsteer.errors`)."""

from __future__ import annotations

from ..errors import ShmsteerError

__all__ = ["VllmPluginError", "BatchLayoutError", "UnsupportedModelError", "CompiledModelError",
           "PluginConfigError"]


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
    """The model runs under ``torch.compile`` (or CUDA graphs), where the plugin's Python forward
    hooks cannot run: start vLLM with ``compilation_config={"mode": 0}`` and ``enforce_eager=True``
    (``-O0 --enforce-eager``) until the apply is a torch custom op."""


class PluginConfigError(VllmPluginError, ValueError):
    """An ``SHMSTEER_VLLM_*`` setting is invalid."""
