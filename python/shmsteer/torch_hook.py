"""Forward hooks that apply shmsteer steering inside a torch model.

A :class:`SteeringHooks` owns one stepper (one per thread). ``SteeringHooks(...)`` builds the
class of one mode, chosen at construction: :class:`NativeHooks` (CPU tensors, the default),
:class:`DeviceHooks` (``device="cuda"``, or ``force_device_path=True``) or :class:`StaticHooks`
(``static=True``); all share this interface. Attach it to the modules whose
output is a hook point, then run each forward pass inside :meth:`SteeringHooks.step` with the
batch layout (which request owns which rows)::

    hooks = SteeringHooks(client)
    for i, block in enumerate(model.layers):
        hooks.attach(block, "post_block", i)
    with torch.inference_mode(), hooks.step([("req-1", 0, 7, "prefill"), ("req-2", 7, 8, "decode")]):
        model(x)

The hooked output must be a contiguous float32, bfloat16 or float16 tensor whose last dimension is
the hidden size, its rows (all leading dimensions flattened) covering the spans; a tuple output is
steered in its first element. The add happens in place, outside autograd: use it for inference.
Anything else (int8 or float64, a wrong width, a non-contiguous tensor, spans past its rows) raises
a typed error before anything is changed.

Each step makes one call into the engine to resolve the whole batch (``shmsteer_batch_resolve``:
every span's slot, the steered sites, the table rows that changed), and, where the native CPU
kernels apply it, one to end it; a hooked site never calls into the engine to resolve anything and
never loops over requests.

* Native (CPU tensors; the default): the native kernels (AVX-512/AVX2) run on the
  tensor's own memory, no copy, one library call per site (bfloat16 widened to float32 and
  narrowed back inside it); float16 CPU tensors go through a float32 copy. The step's determinism checksum (:attr:`SteeringHooks.checksum`)
  covers these applies; a tensor on another device is :class:`DeviceMismatchError`.
* The device path (``device="cuda"``, or any tensor with ``force_device_path``): per site a persistent
  table ``[slots + 1, hidden]`` in the hidden state's dtype (row 0 zeros, row ``s`` the composed
  global + request vector of slot ``s``) is updated only for the rows whose content changed (one
  host-to-device copy of the changed rows per step, none in a steady batch); the per-row slot index
  is uploaded when the batch layout changes; the apply is one ``torch.ops.shmsteer.steer_``
  (:mod:`shmsteer.ops`): a gather-add over the steered rows, then the clamps (projection clamp
  and directional ablation, in float32, global clamps first, as the CPU path). A clamp-free site
  keeps its gathered rows while the layout and its table rows stay (a steady or advancing decode
  batch) and only adds them.
  Unsteered sites cost nothing. The checksum of the CPU applies does not cover the device's
  arithmetic; :attr:`SteeringHooks.batch_checksum` is the determinism checksum of what the step
  resolved (span layout and the action hashes of every steered site's content), equal across ranks
  that resolve the same batch at the same version, whatever the device.

Activation capture (:meth:`SteeringHooks.start_capture`): the rows admitted requests capture
(``Owner.admit(..., capture={consumer: spec}, prompt_len=N)``) are copied at each attached site,
before its steering, into the hooks' capture ring, which consumers read
(:mod:`shmsteer.capture`). Spans carry each request's absolute positions as 5-tuples ``(id, start,
end, phase, first_position)``. The native path captures float32 blocks in the apply and bfloat16 /
float16 ones from their own bytes; the device path gathers each site's planned rows on the device
and makes one device-to-host copy per site into pinned memory, handed to the engine at the step's
end. Static (CUDA-graph) mode captures too (``start_capture`` after attaching, before capturing
the graphs): the graph writes each site's planned rows into persistent device buffers whose
indices ``prepare`` writes, and ``report`` (or the next ``prepare``) makes the step's one
device-to-host copy into pinned memory after the replay and hands the rows to the engine.

CUDA-graph (static) mode: ``SteeringHooks(handle, static=True, max_tokens=T, device=..., dtype=...)``
preallocates, for every attached site, a table ``[max_slots + 1, hidden]`` (and clamp rows when
``max_clamps`` > 0), one index buffer ``[max_tokens]`` and the gather buffers. :meth:`prepare` runs
outside the graph, once per step: one engine call, then copies into those static buffers only
(changed table rows, the index; rows past the batch get slot 0). The hooked forward does only
fixed device work on them, through the operators of :mod:`shmsteer.ops` — no engine call, no
host sync, no branch on data: every attached site does its gather-add (an unsteered row gathers
row 0, zeros) and, with ``max_clamps`` > 0, its ``max_clamps`` clamp passes; with ``max_clamps=0``
a site (while all sites' ``[max_tokens, hidden]`` rows fit 16 MiB) adds rows that ``prepare``
gathered into a persistent buffer when the index or the tables changed. Static mode is also
the ``torch.compile`` mode: the hooks read only persistent tensors that ``prepare`` updates in
place, so ``torch.compile(model, fullgraph=True)`` traces the hooks into the graph once (no graph
break, no recompile per step; call ``start_capture`` before compiling, so that the capture work
is in the graph). The
eager device path is for eager models: what it reads per step (which sites a step steers, the
step's index tensors) is Python state, so under ``torch.compile`` it would recompile as the batch
changes. A vLLM-style runner therefore:

1. builds the hooks in static mode with its largest captured batch as ``max_tokens``;
2. calls ``prepare(spans)`` for a warm-up batch, then captures the forward of each padded batch
   size in a ``torch.cuda.CUDAGraph`` as usual (the hooks are captured with it);
3. per step: ``prepare(spans)`` (spans over the padded batch's rows), copy the inputs into the
   graph's static inputs, ``graph.replay()``. prepare's copies are ordered before the replay on the
   same stream, and never reallocate, so the captured graph keeps reading the right buffers.

Declarative gates (a request's ``steering``, see ``Owner.admit``) run on the device path as on the
native one, with the same decisions. What a step's gates do to a request as a whole (attenuation,
engaged next_step / rest_of_ adds, this_token adds with when=always) is in its table rows. Each
probe gate of a request is a gate column of its rows naming a gate slot (:class:`GateTables`: probe
row, threshold, sharpness, add rows per site): at the probe's site, before the site's gather-add,
the hook computes score = h·probe on the device tensor (float32) and, for this_token,
gate = sigmoid(sharpness·(score − threshold)); after the gather-add of this and every later site it
adds gate × the gate's add rows. The scores go back to the engine once the forward is done (the
step's end in eager mode; :meth:`SteeringHooks.report`, or the next ``prepare``, in static mode):
one more engine call per gated step, where next_step, rest_of_request and rest_of_conversation
decide on the mean of a request's rows. Static mode keeps the gate slot of every (column, row), the
gate and the score in persistent per-token buffers that ``prepare`` writes, so the captured graph
replays them; every attached site then does ``max_row_gates`` columns of fixed work (0 by default:
a probe gate is then ``BatchCapacityError``); none of it allocates outside the operators' own
temporaries (which a CUDA graph keeps in its private pool).
"""

from __future__ import annotations

from ._hooks_base import DeviceMismatchError, SteeringHooks
from ._hooks_device import DeviceHooks
from ._hooks_native import NativeHooks
from ._hooks_static import (LAYOUT_HOOKS, NotBoundError, StaticCapture, StaticCaptureError, StaticHooks, StaticLayout,
                            StaticLayoutError)

__all__ = ["SteeringHooks", "NativeHooks", "DeviceHooks", "StaticHooks", "StaticCapture", "DeviceMismatchError",
           "StaticLayout", "StaticLayoutError", "NotBoundError", "StaticCaptureError", "LAYOUT_HOOKS"]
