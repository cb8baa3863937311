"""Forward hooks that apply shmsteer steering inside a torch model.

A :class:`SteeringHooks` owns one stepper (one per thread). Attach it to the modules whose
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

* CPU float32 tensors (unless ``force_device_path``): the native kernels (AVX-512/AVX2) run on the
  tensor's own memory, no copy, one library call per site; bfloat16 and float16 CPU tensors go
  through a float32 copy. The step's determinism checksum (:attr:`SteeringHooks.checksum`)
  covers these applies, as before.
* The device path (CUDA tensors, or any tensor with ``force_device_path``): per site a persistent
  table ``[slots + 1, hidden]`` in the hidden state's dtype (row 0 zeros, row ``s`` the composed
  global + request vector of slot ``s``) is updated only for the rows whose content changed (one
  host-to-device copy of the changed rows per step, none in a steady batch); the per-row slot index
  is uploaded once per step; the apply is one gather-add over the steered rows, then the clamps
  (projection clamp and directional ablation, in float32, global clamps first, as the CPU path).
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
fixed-shape device work on them — no allocation, no host sync, no branch on data: every attached
site does its gather-add (an unsteered row gathers row 0, zeros) and, with ``max_clamps`` > 0, its
``max_clamps`` clamp passes. A vLLM-style runner therefore:

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
a probe gate is then ``BatchCapacityError``), and none of it allocates.
"""

from __future__ import annotations

import contextlib
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple

import numpy as np
import torch

from .client import PHASES, SpanLike, Stepper, _Handle
from ._lib import check, lib
from .device import (CAPTURE_DTYPES, DeviceTables, GateTables, Resolved, SpanPacker, StepBatch, UnsupportedDtypeError,
                     apply_clamps, check_hidden)
from .errors import ShapeError


class SteeringHooks:
    """Steering forward hooks sharing one stepper, one per-step batch and one batch layout.

    Args:
        handle: a :class:`~shmsteer.Client` or :class:`~shmsteer.Owner`.
        force_device_path: use the device path (tables, one gather-add) even for CPU tensors; for
            tests of that path, and what a GPU worker's host work costs, on machines without a GPU.
        max_slots: distinct (request, phase) compositions one step may hold (table rows - 1).
        max_clamps: clamp directions per (slot, site); 0 refuses clamps (BatchCapacityError) and,
            in static mode, leaves the clamp passes out of the graph.
        static: CUDA-graph mode (see the module doc): needs ``max_tokens``, ``device``, ``dtype``.
        max_gate_slots: distinct probe gates (declarative gates) one step may hold.
        max_row_gates: probe gates one request of a step may carry (gate columns per row);
            default 4, and 0 in static mode, where every attached site does the gate columns'
            fixed work in the graph (a step needing more is BatchCapacityError).
        gate_sites: static mode: the (hook, layer) sites whose gate work is in the graph (default:
            every attached site); a step whose gates probe or add elsewhere is BatchCapacityError.
    """

    def __init__(self, handle: _Handle, force_device_path: bool = False, *, max_slots: int = 256,
                 max_clamps: int = 4, static: bool = False, max_tokens: int = 0, device: Any = None,
                 dtype: Optional[torch.dtype] = None, max_gate_slots: int = 64,
                 max_row_gates: Optional[int] = None, gate_sites: Optional[Sequence[Tuple[str, int]]] = None) -> None:
        self._handle = handle
        self.hidden, self.layers, _ = handle.model
        self.stepper: Stepper = handle.stepper()
        if max_row_gates is None:
            max_row_gates = 0 if static else 4
        self.max_row_gates = max_row_gates
        self.batch = StepBatch(self.stepper, self.hidden, max_slots, max_clamps, max_gate_slots, max_row_gates)
        self._packer = SpanPacker()
        self.force_device_path = force_device_path or static
        self.max_clamps = max_clamps
        self.static = static
        self._removables: List[Any] = []
        self._sites: List[int] = []  # attached sites: the batch stages only these
        self._spans: Optional[Sequence[SpanLike]] = None
        self._packed: Any = None
        self._rows = 0
        self._version = 0
        self._res: Optional[Resolved] = None
        self._pending = False  # the last resolve's updates are not in the tables yet
        self._stale = False  # a resolve's updates were dropped: the next one resets the batch
        self._mode: Optional[str] = None  # "native" or "device" once a step has shown it
        self._tables: Optional[DeviceTables] = None
        # This step's steered sites: table, clamp directions, clamp dirs and params.
        self._ops: Dict[int, Tuple[torch.Tensor, int, Optional[torch.Tensor], Optional[torch.Tensor]]] = {}
        self._g: Optional[torch.Tensor] = None  # the step's gather buffer
        self._sites_key = b""  # the steered sites and clamp counts _ops was built for
        self._idx_key = b""  # the index _idx was uploaded from
        self._tdev = -1  # the tables' device as Tensor.get_device() reports it
        self._idx: Optional[torch.Tensor] = None
        self._rowsel: Optional[torch.Tensor] = None
        self._gather: Optional[torch.Tensor] = None
        self._native = self._device = 0
        self._open = False  # the stepper's step is open (CPU applies may run in it)
        self.checksum = 0  #: determinism checksum of the last step's CPU applies
        self.batch_checksum = 0  #: determinism checksum of what the last step resolved
        self.engine_calls = 0  #: calls that resolve, end or report steps (resolve, begin, end, report)
        # Capture (start_capture): the step's plan on the device path, its row index on the
        # device, the host buffer the sites' rows land in (pinned on CUDA), a device gather
        # buffer, and the sites gathered this step, handed back at its end.
        self._capturing = False
        self._cplan: Optional[Any] = None
        self._cplan_key = b""
        self._cidx: Optional[torch.Tensor] = None
        self._chost: Optional[torch.Tensor] = None
        self._cdev: Optional[torch.Tensor] = None
        self._cdone: List[Tuple[int, torch.Tensor]] = []
        self._scap: Optional[StaticCapture] = None  # static mode's persistent capture buffers
        self.gate_checksum = 0  #: the gate decisions of the last reported step (Stepper.GateChecksum)
        # Declarative gates on the device path (eager): the tables and this step's columns.
        self._gt: Optional[GateTables] = None
        self._gcols = 0
        self._greport = False  # the step awaits its scores (StepBatch.report)
        self._gsites: frozenset = frozenset()
        self._gprobe: Dict[int, List[int]] = {}  # site -> the columns probing there
        self._gadd: Dict[int, List[int]] = {}  # site -> the columns adding there
        self._guni: List[int] = []  # per column: its one gate slot when every row has it, else -1
        self._gidx: Optional[torch.Tensor] = None  # [n, cols] gate slots
        self._gpar: Optional[torch.Tensor] = None  # [3, n, cols]: threshold, sharpness, per_row
        self._gsite: Optional[torch.Tensor] = None  # [n, cols] probe sites
        self._ggate: Optional[torch.Tensor] = None  # [n, cols] float32
        self._gscore: Optional[torch.Tensor] = None  # [n, cols] float32
        if static:
            if max_tokens <= 0 or device is None or dtype is None:
                raise ValueError("shmsteer: static mode needs max_tokens > 0, device and dtype")
            if dtype not in (torch.float32, torch.bfloat16, torch.float16):
                raise UnsupportedDtypeError(f"shmsteer: static tables in {dtype}; use float32, bfloat16 or float16")
            dev = torch.device(device)
            self.max_tokens = max_tokens
            self._tables = DeviceTables(self.hidden, dev, dtype, max_clamps, capacity=max_slots + 1, static=True)
            self._sidx = torch.zeros(max_tokens, dtype=torch.int64, device=dev)
            self._tdev = self._sidx.get_device()
            self._views: Dict[int, Tuple[torch.Tensor, torch.Tensor]] = {}
            self._copied: Optional[Any] = None  # CUDA event after the last index copy
            self._sidx_host = torch.zeros(max_tokens, dtype=torch.int64, pin_memory=dev.type == "cuda")
            self._gbuf = torch.zeros(max_tokens, self.hidden, dtype=dtype, device=dev)
            if max_clamps > 0:
                self._dbuf = torch.zeros(max_tokens, max_clamps, self.hidden, dtype=torch.float32, device=dev)
                self._pbuf = torch.zeros(max_tokens, max_clamps, 3, dtype=torch.float32, device=dev)
                self._hbuf = torch.zeros(max_tokens, self.hidden, dtype=torch.float32, device=dev)
                self._tbuf = torch.zeros(max_tokens, self.hidden, dtype=torch.float32, device=dev)
                self._cbuf = torch.zeros(2, max_tokens, dtype=torch.float32, device=dev)
            # The sites whose gate work is compiled in (None: every attached site).
            self._sgsites: Optional[frozenset] = None if gate_sites is None else frozenset(
                handle.hook_id(hk) * self.layers + layer for hk, layer in gate_sites)
            self._sgpending = False  # the last prepared step awaits its scores
            self._sgcols = 0
            if max_row_gates > 0:
                G, f32 = max_row_gates, torch.float32
                self._sgt = GateTables(self.hidden, dev, dtype, capacity=max_gate_slots + 1, static=True)
                # Per column k, per row t (column-major, so a column is contiguous): the gate slot,
                # its probe site and parameters, and the step's gate and score (zeroed by prepare).
                self._sgidx_host = torch.zeros(G, max_tokens, dtype=torch.int64, pin_memory=dev.type == "cuda")
                self._sgfac_host = torch.ones(G, max_tokens, dtype=f32, pin_memory=dev.type == "cuda")
                self._sgfac = torch.ones(G, max_tokens, dtype=f32, device=dev)
                self._sgidx = torch.zeros(G, max_tokens, dtype=torch.int64, device=dev)
                self._sgsite = torch.full((G, max_tokens), -1, dtype=torch.int64, device=dev)
                self._sgpar = torch.zeros(3, G, max_tokens, dtype=f32, device=dev)
                self._sggate = torch.zeros(G, max_tokens, dtype=f32, device=dev)
                self._sgscore = torch.zeros(G, max_tokens, dtype=f32, device=dev)
                self._sgp = torch.zeros(max_tokens, self.hidden, dtype=f32, device=dev)
                self._sgh = torch.zeros(max_tokens, self.hidden, dtype=f32, device=dev)
                self._sga = torch.zeros(max_tokens, self.hidden, dtype=dtype, device=dev)
                self._sgs = torch.zeros(max_tokens, dtype=f32, device=dev)
                self._sgv = torch.zeros(max_tokens, dtype=f32, device=dev)
                self._sgm = torch.zeros(max_tokens, dtype=torch.bool, device=dev)
                self._sgsite_t: Dict[int, torch.Tensor] = {}  # each attached site as a 0-dim tensor

    @property
    def uploads(self) -> int:
        """Table rows written to the device so far (a new slot or a changed composition)."""
        return self._tables.uploads if self._tables is not None else 0

    # ---- wiring ---------------------------------------------------------------------------

    def attach(self, module: torch.nn.Module, hook: str, layer: int) -> Any:
        """Register a forward hook applying (hook, layer) to module's output."""
        hook_id = self._handle.hook_id(hook)
        if not 0 <= layer < self.layers:
            from .errors import LayerRangeError
            raise LayerRangeError(f"shmsteer: layer {layer}, model has {self.layers}")
        site = hook_id * self.layers + layer
        if site not in self._sites and self._scap is not None:
            raise RuntimeError("shmsteer: static capture's buffers hold the sites attached before start_capture; attach every site first")
        if site not in self._sites:
            self._sites.append(site)
            self.batch.set_sites(self._sites)
        if self.static and self._tables is not None:
            st = self._tables._site(site)
            if self.max_clamps > 0 and st.dirs is None:
                self._tables._clamp_rows(st)
            if self.max_row_gates > 0 and (self._sgsites is None or site in self._sgsites):
                self._sgt.add_table(site)
                self._sgsite_t[site] = torch.tensor(site, dtype=torch.int64, device=self._sgt.device)
            fn_apply = self._static_apply
        else:
            fn_apply = None

        def fn(_mod: torch.nn.Module, _inputs: Any, output: Any) -> None:
            t = output[0] if isinstance(output, (tuple, list)) else output
            if fn_apply is not None:
                fn_apply(t, site)
            else:
                self.apply(t, hook_id, layer)

        r = module.register_forward_hook(fn)
        self._removables.append(r)
        return r

    def remove(self) -> None:
        """Remove every hook attached by this object."""
        for r in self._removables:
            r.remove()
        self._removables.clear()

    # ---- eager steps ----------------------------------------------------------------------

    @contextlib.contextmanager
    def step(self, spans: Sequence[SpanLike], version: int = 0, rows: Optional[int] = None) -> Iterator["SteeringHooks"]:
        """Run one forward pass's hooks with this batch layout, pinned at ``version`` (0: the
        current one; ranks handed the same version apply the same steering). ``rows``: rows of
        the hooked tensors (default: the end of the last span)."""
        if self.static:
            raise RuntimeError("shmsteer: static hooks step with prepare(spans), outside the graph")
        packed = self._packer.pack(spans)
        n = rows if rows is not None else packed.rows
        self._rows = n  # before the resolve: the gate tables are loaded for this step's rows
        self._native = self._device = 0
        if self._mode == "native":
            self._cplan = None  # native applies capture in the engine
            self._version = self.stepper.begin(version)
            self.engine_calls += 1
            self._res = None
            self._open = True
        else:
            # A model steered on the device: the resolve ends its step at once (one engine call
            # per step); a CPU site showing up reopens it at the same version.
            self._open = self._mode is None
            self._resolve(packed, n, version, end=not self._open)
        self._spans, self._packed, self._rows = spans, packed, n
        try:
            yield self
        finally:
            self.checksum = 0
            if self._cdone:
                self._flush_capture()
            if self._greport:
                self._greport = False
                if self._device and not self._native:  # a native apply gated the step itself
                    self._report(self._gscore if self._gcols else None)
            if self._open:
                self.checksum = self.stepper.end()
                self.engine_calls += 1
                self._open = False
            if self._pending:
                self._stale, self._pending = True, False
            if self._device:
                self._mode = "device"
            elif self._native and self._mode is None:
                self._mode = "native"
            self._spans, self._packed, self._res = None, None, None

    # ---- capture ---------------------------------------------------------------------------

    def start_capture(self, rank: int = 0, writer_rank: int = 0, ring_bytes: int = 0, wait: float = 0.0,
                      max_rows: int = 0) -> None:
        """Copy the rows admitted requests capture, at every attached site and before steering
        it, into this hooks' capture ring (:meth:`~shmsteer.Stepper.capture_start`: registered
        with the owner's hub; only ``writer_rank`` captures under tensor parallelism). Spans give
        each request's absolute positions as 5-tuples ``(id, start, end, phase,
        first_position)``. Native path: float32 blocks are captured by the apply, bfloat16 and
        float16 blocks from their own bytes first. Device path: per site one gather of the
        planned rows on the device and one device-to-host copy into pinned memory, handed to the
        engine at the step's end.

        Static (CUDA-graph) mode: call it after attaching every site and before capturing the
        graphs, whose captured forward then writes each site's planned rows into persistent
        device buffers (``max_rows`` rows of the hidden size over all sites per step, default
        ``max_tokens`` x the attached sites; each site's row indices written by :meth:`prepare`,
        fixed shapes, no allocation in the forward); :meth:`report` (or the next
        :meth:`prepare`), after the replay, makes the step's one device-to-host copy into
        pinned memory (asynchronous on CUDA) and hands each site's rows to the engine. A step
        planning more than ``max_rows`` rows is BatchCapacityError from :meth:`prepare`.

        Raises:
            NoHubError when the owner serves no capture; ValueError in static mode before any
            site is attached or for a negative ``max_rows``.
        """
        if self.static:
            if not self._sites:
                raise ValueError("shmsteer: static capture: attach the hooks' sites before start_capture")
            if max_rows < 0:
                raise ValueError(f"shmsteer: max_rows {max_rows} is negative")
        self.stepper.capture_start(rank, writer_rank, ring_bytes, wait)
        self._capturing = rank == writer_rank
        if self.static and self._capturing and self._scap is None:
            self._scap = StaticCapture(self._sites, self.max_tokens, max_rows or self.max_tokens * len(self._sites),
                                       self.hidden, self._gbuf.dtype, self._gbuf.device)

    def stop_capture(self) -> None:
        """Stop capturing (the ring is closed). In static mode the graphs keep their capture
        work, writing nowhere from the next :meth:`prepare` on."""
        if self.static:
            self._flush_static_capture()
        self.stepper.capture_stop()
        self._capturing = False
        self._cplan = None

    def _load_capture(self, dev: Any) -> None:
        """After a resolve: the step's capture plan, its row index uploaded when it changed."""
        plan = self.batch.capture_plan() if self._capturing else None
        self._cplan = plan
        if plan is None:
            return
        key = plan.key()
        if key != self._cplan_key or self._cidx is None or self._cidx.device != dev:
            self._cidx = torch.from_numpy(plan.rows.astype(np.int64)).to(dev)
            self._cplan_key = key

    def _capture_site(self, t: torch.Tensor, site: int) -> None:
        """Device path: gather site's planned rows of t (before its steering add) into a buffer on
        t's device, then one copy into the host buffer (pinned, asynchronous, on a GPU). Handed to
        the engine at the step's end."""
        plan = self._cplan
        if plan is None or self._cidx is None:
            return
        r = plan.site_rows(site)
        if r is None:
            return
        off, n = r
        if self._cidx.device != t.device:  # the tables moved to t's device after the resolve
            self._cidx = self._cidx.to(t.device)
        total = len(plan.rows)
        esize = t.element_size()
        need = total * self.hidden * esize
        host = self._chost
        cuda = t.is_cuda
        if host is None or host.numel() < need or (cuda and not host.is_pinned()):
            host = self._chost = torch.empty(max(need, 1), dtype=torch.uint8, pin_memory=cuda)
        view = host[off * self.hidden * esize:(off + n) * self.hidden * esize].view(t.dtype).view(n, self.hidden)
        rows = t.view(-1, self.hidden)
        idx = self._cidx[off:off + n]
        # One gather into a buffer on t's device, then the site's one device-to-host copy
        # (asynchronous into pinned memory on CUDA; on a CPU tensor the same two steps).
        g = self._cdev
        if g is None or g.shape[0] < total or g.dtype != t.dtype or g.device != t.device:
            g = self._cdev = torch.empty(max(total, 1), self.hidden, dtype=t.dtype, device=t.device)
        gv = g[off:off + n]
        torch.index_select(rows, 0, idx, out=gv)
        view.copy_(gv, non_blocking=cuda)
        self._cdone.append((site, view))

    def _flush_capture(self) -> None:
        """At a step's end: the device copies done, each gathered site to the engine."""
        done, self._cdone = self._cdone, []
        if not done:
            return
        if any(v.is_pinned() for _, v in done) and torch.cuda.is_available():
            torch.cuda.current_stream().synchronize()
        for site, v in done:
            self.batch.capture(site, v.dtype, v.data_ptr(), v.numel() * v.element_size())

    def _resolve(self, packed: Any, rows: int, version: int, end: bool = False) -> Resolved:
        self.engine_calls += 1
        res = self.batch.resolve(packed, rows, version, end, reset=self._stale)
        self._stale = False
        self._res, self._version = res, res.version
        self.batch_checksum = res.checksum
        self._pending = True
        if self.static and self._tables is not None:
            self._tables.update(res)  # prepare() copies the index itself
            self._pending = False
        elif self._tables is not None:
            self._load(res)
            self._load_gates(res)
        if self._capturing and not self.static:
            self._load_capture(self._tables.device if self._tables is not None else torch.device("cpu"))
        return res

    def _report(self, scores: Optional[torch.Tensor]) -> None:
        """Hand the step's probe scores ([rows, cols] float32, on any device) back."""
        self.engine_calls += 1
        self.gate_checksum = self.batch.report(None if scores is None else scores.cpu().numpy())

    def _load_gates(self, res: Resolved) -> None:
        """Eager: bring the gate tables up to date with res and set up this step's columns."""
        g = res.gates
        self._greport = g.report
        self._gcols = g.cols
        if g.cols == 0 and not len(g.updates) and not len(g.adds):
            self._gsites = frozenset()
            return
        tb = self._tables
        assert tb is not None
        if self._gt is None:
            self._gt = GateTables(self.hidden, tb.device, tb.dtype)
        gt = self._gt
        gt.update(g)
        if g.cols == 0:
            self._gsites = frozenset()
            return
        n, dev = self._rows, tb.device
        rows = np.ascontiguousarray(g.rows[:n], dtype=np.int64)
        site_of = gt.site_host[rows]  # [n, cols]
        self._gprobe = {}
        for k in range(g.cols):
            for site in np.unique(site_of[:, k]).tolist():
                if site >= 0:
                    self._gprobe.setdefault(site, []).append(k)
        self._gadd = {}
        for site, nz in gt.adds_host.items():
            ks = [k for k in range(g.cols) if nz[rows[:, k]].any()]
            if ks:
                self._gadd[site] = ks
        self._gsites = frozenset(g.sites.tolist())
        # A column whose rows all read one slot (every row of the batch gated alike, the usual
        # decode batch) takes a matrix-vector product and a broadcast add instead of gathers.
        self._guni = [int(rows[0, k]) if n and (rows[:, k] == rows[0, k]).all() else -1 for k in range(g.cols)]
        idx = torch.from_numpy(rows).to(dev)
        self._gidx = idx
        flat = idx.view(-1)
        self._gsite = gt.site.index_select(0, flat).view(n, g.cols)
        self._gpar = torch.stack((gt.thr.index_select(0, flat), gt.sharp.index_select(0, flat),
                                  gt.per_row.index_select(0, flat))).view(3, n, g.cols)
        self._gpar[2].mul_(torch.from_numpy(np.ascontiguousarray(g.factor[:n])).to(dev))  # the rows' attenuation
        self._ggate = torch.zeros(n, g.cols, dtype=torch.float32, device=dev)
        self._gscore = torch.zeros(n, g.cols, dtype=torch.float32, device=dev)

    def _gate_probe(self, rows: torch.Tensor, site: int) -> None:
        """Eager, before the site's gather-add: read the probes of the columns probing here."""
        cols = self._gprobe.get(site)
        if not cols:
            return
        assert self._gt is not None and self._gidx is not None and self._gpar is not None
        assert self._gsite is not None and self._ggate is not None and self._gscore is not None
        h = rows.float()
        for k in cols:
            j = self._guni[k]
            if j >= 0:  # every row reads slot j, which probes here
                sc = torch.mv(h, self._gt.probe[j])
                self._gscore[:, k] = sc
                self._ggate[:, k] = torch.sigmoid(self._gpar[1, :, k] * (sc - self._gpar[0, :, k])) * self._gpar[2, :, k]
                continue
            p = self._gt.probe.index_select(0, self._gidx[:, k])
            sc = (h * p).sum(1)
            m = self._gsite[:, k] == site
            self._gscore[:, k] = torch.where(m, sc, self._gscore[:, k])
            v = torch.sigmoid(self._gpar[1, :, k] * (sc - self._gpar[0, :, k])) * self._gpar[2, :, k]
            self._ggate[:, k] = torch.where(m, v, self._ggate[:, k])

    def _gate_add(self, rows: torch.Tensor, site: int) -> None:
        """Eager, after the site's gather-add: add each column's gated add rows."""
        assert self._gt is not None and self._gidx is not None and self._ggate is not None
        a = self._gt.adds.get(site)
        cols = self._gadd.get(site)
        if a is None or not cols:
            return
        for k in cols:
            j = self._guni[k]
            add = a[j].unsqueeze(0) if j >= 0 else a.index_select(0, self._gidx[:, k])
            w = self._ggate[:, k : k + 1]
            if rows.dtype is torch.float32:
                rows.addcmul_(w, add)
            else:
                rows.add_(w * add.float())

    def _load(self, res: Resolved) -> None:
        """Bring the tables up to date with res and upload the step's index (eager). A step
        whose sites and index equal the last one's (a steady decode batch) reuses them."""
        tb = self._tables
        assert tb is not None
        changed = len(res.updates) > 0
        tb.update(res)
        self._pending = False
        sites_key = res.sites.tobytes() + res.site_clamps.tobytes()
        if changed or sites_key != self._sites_key:
            self._ops = {}
            for site, k in zip(res.sites.tolist(), res.site_clamps.tolist()):
                st = tb.sites[site]
                self._ops[site] = (st.vec, k, st.dirs if k else None, st.params if k else None)
            self._sites_key = sites_key
        if not self._ops:
            self._idx = self._rowsel = None
            self._idx_key = b""
            return
        idx = res.index
        idx_key = idx.tobytes()
        if idx_key == self._idx_key and self._idx is not None:
            return  # the same rows and slots as the last step: nothing to upload
        dev = tb.device
        nz = np.flatnonzero(idx)
        if len(nz) == len(idx):
            self._rowsel = None
            self._idx = torch.from_numpy(idx.astype(np.int64)).to(dev)
        else:
            both = torch.from_numpy(np.stack((nz, idx[nz])).astype(np.int64)).to(dev)  # one upload
            self._rowsel, self._idx = both[0], both[1]
        self._idx_key = idx_key
        # One gather buffer for every site of the step (and the next steps of the same size):
        # the sites allocate nothing.
        g = self._gather
        if g is None or g.shape[0] < len(nz) or g.dtype != tb.dtype or g.device != dev:
            g = self._gather = torch.empty(max(len(nz), 1), self.hidden, dtype=tb.dtype, device=dev)
        self._g = g[: len(nz)]

    def apply(self, t: torch.Tensor, hook_id: int, layer: int) -> None:
        """Apply (hook, layer) to t in place for the current step's batch."""
        if self._packed is None:
            raise RuntimeError("shmsteer: steering hook ran outside SteeringHooks.step()")
        check_hidden(t, self.hidden)
        if t.numel() // self.hidden < self._rows:
            raise ShapeError(f"shmsteer: the spans cover {self._rows} rows, the hooked output has {t.numel() // self.hidden}")
        if t.get_device() < 0 and not self.force_device_path:  # a CPU tensor
            self._native += 1
            if not self._open:
                self._version = self.stepper.begin(self._version)
                self.engine_calls += 1
                self._open = True
            p = self._packed
            # The stepper is this object's own (one thread at a time, as the hooks are): the
            # kernels run on the tensor's memory, or on a float32 copy for bf16/f16 (captured
            # first from their own bytes: the apply of the copy does not capture the site again).
            if self._capturing and t.dtype is not torch.float32:
                check(lib.shmsteer_stepper_capture(self.stepper.handle, hook_id, layer, t.data_ptr(),
                                                   t.numel() * t.element_size(), CAPTURE_DTYPES[t.dtype], p.ptr, p.n))
            t32 = t if t.dtype is torch.float32 else t.float()
            check(lib.shmsteer_stepper_apply(self.stepper.handle, hook_id, layer, t32.data_ptr(), t32.numel(), p.ptr, p.n))
            if t32 is not t:
                t.copy_(t32)
            return
        self._device += 1
        self._device_apply(t, hook_id * self.layers + layer)

    def _device_apply(self, t: torch.Tensor, site: int) -> None:
        tb = self._tables
        if self._res is None or tb is None:
            self._first_device_apply(t)
            tb = self._tables
            assert tb is not None
        if t.dtype is not tb.dtype or t.get_device() != self._tdev:
            raise UnsupportedDtypeError(
                f"shmsteer: the device tables are {tb.dtype} on {tb.device}, this site's output is {t.dtype} on {t.device}: "
                "steer one dtype on one device per SteeringHooks")
        if self._cplan is not None:
            self._capture_site(t, site)  # before the add: captures see the unsteered rows
        ops = self._ops.get(site)
        gated = self._gcols > 0 and site in self._gsites
        if ops is None and not gated:
            return  # unsteered site
        rows = t.view(-1, self.hidden)
        n = self._rows
        if gated:
            self._gate_probe(rows[:n], site)
        if ops is None:
            self._gate_add(rows[:n], site)
            return
        vec, k, dirs, params = ops
        g = torch.index_select(vec, 0, self._idx, out=self._g)
        sel = self._rowsel
        if sel is None:
            (rows if rows.shape[0] == n else rows[:n]).add_(g)
        else:
            rows.index_add_(0, sel, g)
        if gated:
            self._gate_add(rows[:n], site)
        if k == 0 or dirs is None:
            return
        dirs = dirs.index_select(0, self._idx)
        params = params.index_select(0, self._idx)
        if sel is None and t.dtype is torch.float32:
            apply_clamps(rows[:n], dirs, params, k)
            return
        h = (rows[:n] if sel is None else rows.index_select(0, sel)).float()
        apply_clamps(h, dirs, params, k)
        if sel is None:
            rows[:n].copy_(h)
        else:
            rows.index_copy_(0, sel, h.to(t.dtype))

    def _first_device_apply(self, t: torch.Tensor) -> None:
        """The step's first device-path site when the tables or the resolve are missing."""
        if self._res is None:
            # The hooks ran natively until now: resolve this step once more, at its version,
            # into fresh tables (only where a model's tensors moved to a device).
            self._stale = True
            self._resolve(self._packed, self._rows, self._version)
        if self._tables is None:
            self._tables = DeviceTables(self.hidden, t.device, t.dtype, self.max_clamps)
            self._tdev = t.get_device()
            assert self._res is not None
            self._load(self._res)
            self._load_gates(self._res)

    # ---- static (CUDA-graph) mode ---------------------------------------------------------

    def prepare(self, spans: Sequence[SpanLike], version: int = 0) -> int:
        """Static mode, outside the graph: resolve the step (one engine call, the step ended at
        once) and copy what changed into the static buffers. Returns the pinned version."""
        if not self.static or self._tables is None:
            raise RuntimeError("shmsteer: prepare() is for static hooks (SteeringHooks(..., static=True))")
        packed = self._packer.pack(spans)
        if self._sgpending or (self._scap is not None and self._scap.pending):
            self.report()
        res = self._resolve(packed, self.max_tokens, version, end=True)
        self._res = None
        cplan = None
        if self._scap is not None:
            cplan = self.batch.capture_plan() if self._capturing else None
            self._scap.check(cplan)  # BatchCapacityError before any copy
        if self._copied is not None:
            # The last step's index copy reads the pinned host buffer asynchronously: it must
            # have run before the buffer is rewritten (normally long done; outside the graph).
            self._copied.synchronize()
        self._sidx_host.numpy()[:] = res.index
        self._sidx.copy_(self._sidx_host, non_blocking=True)
        if self._scap is not None:
            self._scap.plan(cplan)
        g = res.gates
        self._sgpending, self._sgcols = g.report, g.cols
        if g.cols and self._sgsites is not None and not self._sgsites.issuperset(g.sites.tolist()):
            from .errors import BatchCapacityError
            out = sorted(set(g.sites.tolist()) - self._sgsites)
            raise BatchCapacityError(f"shmsteer: the step's gates probe or add at sites {out} (hook_id * layers + layer), "
                                     "outside the static gate_sites: add them to gate_sites")
        if self.max_row_gates > 0:
            gt = self._sgt
            gt.update(g)
            host = self._sgidx_host.numpy()
            host[:] = 0
            host[: g.cols] = g.rows.T
            self._sgidx.copy_(self._sgidx_host, non_blocking=True)
            fac = self._sgfac_host.numpy()
            fac[:] = 1
            fac[: g.cols] = g.factor.T
            self._sgfac.copy_(self._sgfac_host, non_blocking=True)
            flat = self._sgidx.view(-1)
            torch.index_select(gt.site, 0, flat, out=self._sgsite.view(-1))
            torch.index_select(gt.thr, 0, flat, out=self._sgpar[0].view(-1))
            torch.index_select(gt.sharp, 0, flat, out=self._sgpar[1].view(-1))
            torch.index_select(gt.per_row, 0, flat, out=self._sgpar[2].view(-1))
            self._sgpar[2].mul_(self._sgfac)  # the rows' attenuation
            self._sggate.zero_()
            self._sgscore.zero_()
        if self._sidx.is_cuda:
            if self._copied is None:
                self._copied = torch.cuda.Event()
            self._copied.record()
        return res.version

    def report(self) -> None:
        """Static mode: hand the last prepared step's gate scores and captured rows back (after
        its replay; this waits for the device). prepare() does it for the previous step when it
        was not done; a step whose batch has no probe gates and captures nothing needs none."""
        if not self.static:
            return
        self._flush_static_capture()
        if not self._sgpending:
            return
        self._sgpending = False
        cols = self._sgcols
        self._report(self._sgscore[:cols].t() if cols else None)

    def _flush_static_capture(self) -> None:
        """Static, after the replay: the step's one device-to-host copy of the captured rows,
        then each site's rows to the engine (before the next resolve)."""
        sc = self._scap
        if sc is None or not sc.pending:
            return
        for site, ptr, n_bytes in sc.collect():
            self.batch.capture(site, sc.dtype, ptr, n_bytes)

    def _static_gate_probe(self, rows: torch.Tensor, site: int, n: int) -> None:
        """Static, before the site's gather-add: every gate column's probe read (fixed work: a
        column whose slot probes elsewhere keeps its score and gate)."""
        gt = self._sgt
        p, s, v, m = self._sgp[:n], self._sgs[:n], self._sgv[:n], self._sgm[:n]
        if rows.dtype is torch.float32:
            h = rows
        else:
            h = self._sgh[:n]
            h.copy_(rows)
        for k in range(self.max_row_gates):
            torch.index_select(gt.probe, 0, self._sgidx[k, :n], out=p)
            torch.mul(h, p, out=p)
            torch.sum(p, 1, out=s)
            torch.eq(self._sgsite[k, :n], self._sgsite_t[site], out=m)
            score, gate = self._sgscore[k, :n], self._sggate[k, :n]
            torch.where(m, s, score, out=score)
            torch.sub(s, self._sgpar[0, k, :n], out=v)
            v.mul_(self._sgpar[1, k, :n]).sigmoid_().mul_(self._sgpar[2, k, :n])
            torch.where(m, v, gate, out=gate)

    def _static_gate_add(self, rows: torch.Tensor, site: int, n: int) -> None:
        """Static, after the site's gather-add: every gate column's gated add (fixed work)."""
        a, h = self._sga[:n], self._sgh[:n]
        table = self._sgt.adds[site]
        for k in range(self.max_row_gates):
            torch.index_select(table, 0, self._sgidx[k, :n], out=a)
            w = self._sggate[k, :n].unsqueeze(1)
            if rows.dtype is torch.float32:
                rows.addcmul_(w, a)
            else:
                h.copy_(a)
                h.mul_(w)
                rows.add_(h)

    def _static_apply(self, t: torch.Tensor, site: int) -> None:
        tb = self._tables
        assert tb is not None
        if t.dtype is not tb.dtype or t.get_device() != self._tdev:
            raise UnsupportedDtypeError(f"shmsteer: static tables are {tb.dtype} on {tb.device}, the hooked output is {t.dtype} on {t.device}")
        check_hidden(t, self.hidden)
        rows = t.view(-1, self.hidden)
        n = rows.shape[0]
        if n > self.max_tokens:
            raise ShapeError(f"shmsteer: the hooked output has {n} rows, static mode holds max_tokens={self.max_tokens}")
        st = tb.sites[site]
        views = self._views.get(n)
        if views is None:  # once per captured batch size: views of the static buffers
            views = self._views[n] = (self._sidx[:n], self._gbuf[:n])
        idx, g = views
        if self._scap is not None:
            self._scap.gather(rows, site, n)  # before the add: captures see the unsteered rows
        gated = self.max_row_gates > 0 and site in self._sgt.adds
        if gated:
            self._static_gate_probe(rows, site, n)
        torch.index_select(st.vec, 0, idx, out=g)
        rows.add_(g)
        if gated:
            self._static_gate_add(rows, site, n)
        if self.max_clamps <= 0 or st.dirs is None or st.params is None:
            return
        dirs, params = self._dbuf[:n], self._pbuf[:n]
        torch.index_select(st.dirs, 0, idx, out=dirs)
        torch.index_select(st.params, 0, idx, out=params)
        if t.dtype == torch.float32:
            apply_clamps(rows, dirs, params, self.max_clamps, self._tbuf[:n], self._cbuf[:, :n])
        else:
            h = self._hbuf[:n]
            h.copy_(rows)
            apply_clamps(h, dirs, params, self.max_clamps, self._tbuf[:n], self._cbuf[:, :n])
            rows.copy_(h)

    def close(self) -> None:
        """Remove the hooks and free the batch and the stepper (in static mode, after handing
        the last replayed step's captured rows to the engine)."""
        if self.static and self._scap is not None and self._scap.pending:
            self._flush_static_capture()
        self.remove()
        self.batch.close()
        self.stepper.close()


class StaticCapture:
    """Static (CUDA-graph) mode's capture buffers, persistent and of fixed shapes: per attached
    site a row of source and destination indices (``[2, sites, max_tokens]``, written by
    :meth:`plan` outside the graph), a gather buffer ``[max_tokens, hidden]``, the step's
    captured rows ``[max_rows + max_tokens, hidden]`` on the device (each site's rows at its
    plan offset; an index past the plan lands in a row of its own past ``max_rows``, so no
    index repeats within a site's copy), and their pinned host copy ``[max_rows, hidden]``.
    In the graph each site does one gather and one index copy of ``n`` rows (the graph's rows);
    after the replay :meth:`collect` makes the one device-to-host copy."""

    def __init__(self, sites: Sequence[int], max_tokens: int, max_rows: int, hidden: int, dtype: torch.dtype,
                 device: torch.device) -> None:
        self.slot = {s: i for i, s in enumerate(sites)}
        self.max_tokens, self.max_rows, self.hidden, self.dtype = max_tokens, max_rows, hidden, dtype
        self.cuda = device.type == "cuda"
        S, T = len(sites), max_tokens
        self._idx_host = torch.zeros(2, S, T, dtype=torch.int64, pin_memory=self.cuda)
        self._idx = torch.zeros(2, S, T, dtype=torch.int64, device=device)
        self._unused = np.arange(max_rows, max_rows + T, dtype=np.int64)
        self._idx_host.numpy()[1] = self._unused
        self._idx.copy_(self._idx_host)
        self._tmp = torch.zeros(T, hidden, dtype=dtype, device=device)
        self._buf = torch.zeros(max_rows + T, hidden, dtype=dtype, device=device)
        self._host = torch.zeros(max(max_rows, 1), hidden, dtype=dtype, pin_memory=self.cuda)
        self._done = torch.cuda.Event() if self.cuda else None
        self._views: Dict[Tuple[int, int], Tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = {}
        self._key: Optional[bytes] = None
        self._sites: List[Tuple[int, int, int]] = []  # the step's (site, offset, rows)
        self._used = 0
        self.pending = False  # a prepared step's rows await collect()

    def check(self, plan: Any) -> None:
        """BatchCapacityError when the step plans more rows than the buffers hold (nothing of
        this step will be captured)."""
        total = 0 if plan is None else len(plan.rows)
        if total > self.max_rows:
            self.pending, self._sites, self._used = False, [], 0
            from .errors import BatchCapacityError
            raise BatchCapacityError(f"shmsteer: the step captures {total} rows over its sites, static capture holds "
                                     f"max_rows={self.max_rows}: start_capture(max_rows=...) larger")

    def plan(self, plan: Any) -> None:
        """Outside the graph, after the resolve (and after the previous copies of the index
        buffers ran): write the step's plan into the index buffers when it changed."""
        self.check(plan)
        self.pending, self._sites, self._used = False, [], 0
        total = 0 if plan is None else len(plan.rows)
        key = b"" if plan is None else plan.key()
        sites: List[Tuple[int, int, int]] = []
        if plan is not None:
            for i, site in enumerate(plan.sites.tolist()):
                off, end = int(plan.start[i]), int(plan.start[i + 1])
                if end > off:
                    sites.append((site, off, end - off))
        if key != self._key:
            h = self._idx_host.numpy()
            h[0] = 0
            h[1] = self._unused
            for site, off, n in sites:
                slot = self.slot[site]  # the batch plans the attached sites only
                h[0, slot, :n] = plan.rows[off:off + n]
                h[1, slot, :n] = np.arange(off, off + n)
            self._idx.copy_(self._idx_host, non_blocking=self.cuda)
            self._key = key
        self._sites, self._used, self.pending = sites, total, total > 0

    def gather(self, rows: torch.Tensor, site: int, n: int) -> None:
        """In the (captured) forward, before the site's add: its planned rows of rows ([n,
        hidden]) into their places in the device buffer; fixed shapes, no allocation."""
        v = self._views.get((site, n))
        if v is None:  # once per (site, captured batch size): views of the persistent buffers
            slot = self.slot[site]
            v = self._views[(site, n)] = (self._idx[0, slot, :n], self._idx[1, slot, :n], self._tmp[:n])
        src, dst, tmp = v
        torch.index_select(rows, 0, src, out=tmp)
        self._buf.index_copy_(0, dst, tmp)

    def collect(self) -> List[Tuple[int, int, int]]:
        """After the replay: the step's one device-to-host copy of its captured rows (into
        pinned memory, asynchronous on CUDA, then waited for), and per site (site, host address,
        bytes) of its rows, valid until the next collect."""
        self.pending = False
        u = self._used
        self._host[:u].copy_(self._buf[:u], non_blocking=self.cuda)
        if self._done is not None:
            self._done.record()
            self._done.synchronize()
        row = self.hidden * self._host.element_size()
        base = self._host.data_ptr()
        return [(site, base + off * row, n * row) for site, off, n in self._sites]


__all__ = ["SteeringHooks", "StaticCapture"]
