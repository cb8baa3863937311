"""Forward hooks that apply shmsteer steering inside a torch model.

A :class:`SteeringHooks` owns one stepper (one per thread). Attach it to the modules whose
output is a hook point, then run each forward pass inside :meth:`SteeringHooks.step` with the
batch layout (which request owns which rows)::

    hooks = SteeringHooks(client)
    for i, block in enumerate(model.layers):
        hooks.attach(block, "post_block", i)
    with torch.inference_mode(), hooks.step([("req-1", 0, 7, "prefill"), ("req-2", 7, 8, "decode")]):
        model(x)

The hooked output must be a float32 tensor whose last dimension is the hidden size, its rows
(all leading dimensions flattened) matching the spans; a tuple output is steered in its first
element. The add happens in place, outside autograd: use it for inference.

* CPU tensors: the native kernels (AVX-512/AVX2) run on the tensor's own memory, no copy, and the
  step's determinism checksum covers them.
* CUDA tensors: each request's composed vector is kept on the device and re-uploaded only when its
  digest changes (a new version of any input); the add is one ``index_add_`` over the steered
  rows. Clamps are not supported there (NotImplementedError), and the checksum does not cover
  device applies.
"""

from __future__ import annotations

import contextlib
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple

import torch

from .client import PHASES, SpanLike, Stepper, _Handle


class SteeringHooks:
    """Steering forward hooks sharing one stepper and one batch layout.

    Args:
        handle: a :class:`~shmsteer.Client` or :class:`~shmsteer.Owner`.
        force_device_path: use the device path (cached vectors, one index_add_) even for CPU
            tensors; for tests of that path on machines without a GPU.
    """

    def __init__(self, handle: _Handle, force_device_path: bool = False) -> None:
        self._handle = handle
        self.stepper: Stepper = handle.stepper()
        self.force_device_path = force_device_path
        self._spans: Optional[List[Tuple[str, int, int, int]]] = None
        self._packed: Any = None
        self._cache: Dict[Tuple[str, int, int, int, str], Tuple[bytes, torch.Tensor]] = {}
        self._removables: List[Any] = []
        self.uploads = 0  #: device uploads of composed vectors (a cache miss or a new digest)
        self.checksum = 0  #: determinism checksum of the last step

    def attach(self, module: torch.nn.Module, hook: str, layer: int) -> Any:
        """Register a forward hook applying (hook, layer) to module's output."""
        hook_id = self._handle.hook_id(hook)

        def fn(_mod: torch.nn.Module, _inputs: Any, output: Any) -> None:
            t = output[0] if isinstance(output, (tuple, list)) else output
            self.apply(t, hook_id, layer)

        r = module.register_forward_hook(fn)
        self._removables.append(r)
        return r

    def remove(self) -> None:
        """Remove every hook attached by this object."""
        for r in self._removables:
            r.remove()
        self._removables.clear()

    @contextlib.contextmanager
    def step(self, spans: Sequence[SpanLike], version: int = 0) -> Iterator["SteeringHooks"]:
        """Run one forward pass's hooks with this batch layout, pinned at ``version`` (0: the
        current one; ranks handed the same version apply the same steering)."""
        self._spans = [(rid, int(s), int(e), PHASES[p]) for rid, s, e, p in spans]
        self._packed = self.stepper.spans(spans)
        self.stepper.begin(version)
        try:
            yield self
        finally:
            self.checksum = self.stepper.end()
            self._spans, self._packed = None, None

    def apply(self, t: torch.Tensor, hook_id: int, layer: int) -> None:
        """Apply (hook, layer) to t in place for the current step's batch."""
        if self._spans is None:
            raise RuntimeError("shmsteer: steering hook ran outside SteeringHooks.step()")
        if t.dtype != torch.float32:
            raise TypeError(f"shmsteer: hooked output must be float32, not {t.dtype}")
        if not t.is_contiguous():
            raise ValueError("shmsteer: hooked output is not contiguous")
        if t.device.type == "cpu" and not self.force_device_path:
            self.stepper.apply_ptr(hook_id, layer, t.data_ptr(), t.numel(), self._packed)
            return
        self._device_apply(t, hook_id, layer)

    def _device_apply(self, t: torch.Tensor, hook_id: int, layer: int) -> None:
        rows = t.view(-1, t.shape[-1])
        vecs: List[torch.Tensor] = []
        row_idx: List[int] = []
        vec_idx: List[int] = []
        dev = str(t.device)
        for rid, start, end, phase in self._spans or ():
            if start >= end:
                continue
            eff = self.stepper.effective(rid, hook_id, layer, phase)
            if eff.clamps:
                raise NotImplementedError(
                    "shmsteer: clamps are not supported on the device path; steer this model on CPU")
            if not eff.data_ptr and not eff.global_ptr:
                continue
            key = (rid, hook_id, layer, phase, dev)
            hit = self._cache.get(key)
            if hit is None or hit[0] != eff.digest:
                if len(self._cache) > 65536:
                    self._cache.clear()
                hit = (eff.digest, torch.from_numpy(eff.array()).to(t.device))
                self._cache[key] = hit
                self.uploads += 1
            vec_idx.extend([len(vecs)] * (end - start))
            vecs.append(hit[1])
            row_idx.extend(range(start, end))
        if not vecs:
            return
        table = torch.stack(vecs)
        ri = torch.tensor(row_idx, device=t.device)
        vi = torch.tensor(vec_idx, device=t.device)
        rows.index_add_(0, ri, table.index_select(0, vi))


__all__ = ["SteeringHooks"]
