"""Static mode (CUDA graphs, torch.compile): persistent buffers written by ``prepare`` between
steps, read by a fixed sequence of :mod:`shmsteer.ops` calls at every hooked site."""

from __future__ import annotations

from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np
import torch

from . import ops
from ._hooks_base import ADDEND_BYTES, DeviceMismatchError, SteeringHooks
from .client import SpanLike
from .device import CapturePlan, DeviceTables, GateTables, ResolvedGates, UnsupportedDtypeError, check_hidden
from .errors import BatchCapacityError, ShapeError, ShmsteerError

#: The owner's default hook order (``Owner(hooks=None)``, :data:`shmsteer.openai.DEFAULT_HOOKS`):
#: the hook ids a :class:`StaticLayout` assumes by default.
LAYOUT_HOOKS: Tuple[str, ...] = ("pre_attn", "post_attn", "post_block", "mlp_in", "mlp_out")


class StaticLayoutError(ShmsteerError, ValueError):
    """The handle bound to static hooks does not match the layout their buffers were built for
    (hidden size, layers, or the id of an attached site's hook): nothing was changed."""


class NotBoundError(ShmsteerError, RuntimeError):
    """Static hooks built on a :class:`StaticLayout` were asked to step or capture before
    :meth:`StaticHooks.bind` gave them an owner's handle."""


class StaticCaptureError(ShmsteerError, RuntimeError):
    """The owner serves capture, but the static hooks were sealed (their graphs may be captured)
    without capture buffers: :meth:`StaticHooks.capture_buffers` before :meth:`StaticHooks.seal`.
    The capture ring was closed again; nothing is captured."""


class StaticLayout:
    """What static hooks need to allocate their buffers before any owner exists: the model's
    hidden size and layers and the hook names in id order (default :data:`LAYOUT_HOOKS`, the
    owner's default). ``SteeringHooks(StaticLayout(...), static=True, ...)`` builds hooks that run
    (adding zeros) but cannot step until :meth:`StaticHooks.bind` gives them an owner's handle
    with the same layout."""

    detached = True

    def __init__(self, hidden: int, layers: int, hooks: Sequence[str] = LAYOUT_HOOKS) -> None:
        if hidden <= 0 or layers <= 0 or not hooks:
            raise ValueError(f"shmsteer: static layout hidden {hidden}, layers {layers}, hooks {list(hooks)}")
        self.model = (int(hidden), int(layers), list(hooks))

    def hook_id(self, hook: Any) -> int:
        """The id of a hook name (its index in the layout's hooks; ints pass through)."""
        if not isinstance(hook, str):
            return int(hook)
        try:
            return self.model[2].index(hook)
        except ValueError:
            from .errors import UnknownHookError
            raise UnknownHookError(f"shmsteer: hook {hook!r} not in the static layout {self.model[2]}") from None


class StaticGates:
    """Static mode's probe gates: the gate tables and, per gate column ``k`` and row ``t``
    (column-major ``[G, max_tokens]``, G = ``max_row_gates``), the gate slot, its probe site and
    parameters, and the step's gate and score, all persistent; :meth:`load` writes them."""

    def __init__(self, hidden: int, device: torch.device, dtype: torch.dtype, max_tokens: int, columns: int,
                 max_gate_slots: int, sites: Optional[frozenset]) -> None:
        G, T, f32, pin = columns, max_tokens, torch.float32, device.type == "cuda"
        self.columns = G
        self.sites = sites  #: the sites whose gate work is in the graph (None: every attached site)
        self.tables = GateTables(hidden, device, dtype, capacity=max_gate_slots + 1, static=True)
        self.slots_host = torch.zeros(G, T, dtype=torch.int64, pin_memory=pin)
        self.factor_host = torch.ones(G, T, dtype=f32, pin_memory=pin)
        self.factor = torch.ones(G, T, dtype=f32, device=device)
        self.slots = torch.zeros(G, T, dtype=torch.int64, device=device)
        self.site = torch.full((G, T), -1, dtype=torch.int64, device=device)
        self.params = torch.zeros(3, G, T, dtype=f32, device=device)
        self.gate = torch.zeros(G, T, dtype=f32, device=device)
        self.score = torch.zeros(G, T, dtype=f32, device=device)
        self.awaiting = False  #: the last prepared step awaits its scores
        self.cols = 0  #: gate columns of the last prepared step
        # The operators' temporaries (ops.gate_probe_, ops.gate_add_), none without columns.
        R = T if G else 0
        self.probe_scratch = [torch.zeros(R, hidden, dtype=f32, device=device), torch.zeros(R, hidden, dtype=f32, device=device),
                              torch.zeros(R, dtype=f32, device=device), torch.zeros(R, dtype=f32, device=device),
                              torch.zeros(R, dtype=torch.bool, device=device)]
        self.add_scratch = [torch.zeros(R, hidden, dtype=dtype, device=device)]
        self.site_t: Dict[int, torch.Tensor] = {}  #: each gated site as a 0-dim tensor

    def site_tensor(self, site: int) -> torch.Tensor:
        t = self.site_t.get(site)
        if t is None:
            t = self.site_t[site] = torch.tensor(site, dtype=torch.int64, device=self.tables.device)
        return t

    def gated(self, site: int) -> bool:
        return self.columns > 0 and (self.sites is None or site in self.sites)

    def check(self, g: ResolvedGates) -> None:
        """BatchCapacityError for a step whose gates probe or add outside the graph's sites."""
        if g.cols and self.sites is not None and not self.sites.issuperset(g.sites.tolist()):
            out = sorted(set(g.sites.tolist()) - self.sites)
            raise BatchCapacityError(f"shmsteer: the step's gates probe or add at sites {out} (hook_id * layers + layer), "
                                     "outside the static gate_sites: add them to gate_sites")

    def load(self, g: ResolvedGates) -> None:
        """Outside the graph: the step's gate tables and columns into the persistent buffers."""
        self.awaiting, self.cols = g.report, g.cols
        if self.columns == 0:
            return
        gt = self.tables
        gt.update(g)
        host = self.slots_host.numpy()
        host[:] = 0
        host[: g.cols] = g.rows.T
        self.slots.copy_(self.slots_host, non_blocking=True)
        fac = self.factor_host.numpy()
        fac[:] = 1
        fac[: g.cols] = g.factor.T
        self.factor.copy_(self.factor_host, non_blocking=True)
        flat = self.slots.view(-1)
        torch.index_select(gt.site, 0, flat, out=self.site.view(-1))
        torch.index_select(gt.thr, 0, flat, out=self.params[0].view(-1))
        torch.index_select(gt.sharp, 0, flat, out=self.params[1].view(-1))
        torch.index_select(gt.per_row, 0, flat, out=self.params[2].view(-1))
        self.params[2].mul_(self.factor)  # the rows' attenuation
        self.gate.zero_()
        self.score.zero_()

    def scores(self) -> Optional[torch.Tensor]:
        """The last replayed step's scores, ``[rows, cols]`` (None without columns)."""
        return self.score[: self.cols].t() if self.cols else None


class StaticCapture:
    """Static mode's capture buffers, persistent and of fixed shapes: per attached site a row of
    source and destination indices (``[2, sites, max_tokens]``, written by :meth:`plan` outside
    the graph), the step's captured rows ``[max_rows + max_tokens, hidden]`` on the device (each
    site's rows at its plan offset; an index past the plan lands in a row of its own past
    ``max_rows``, so no index repeats within a site's copy), and their pinned host copy
    ``[max_rows, hidden]``. In the graph each site does one ``torch.ops.shmsteer.capture_`` of
    ``n`` rows (the graph's rows); after the replay :meth:`collect` makes the one device-to-host
    copy."""

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
        self.buf = torch.zeros(max_rows + T, hidden, dtype=dtype, device=device)
        self.scratch = [torch.zeros(T, hidden, dtype=dtype, device=device)]  # ops.capture_'s gather
        self._host = torch.zeros(max(max_rows, 1), hidden, dtype=dtype, pin_memory=self.cuda)
        self._done = torch.cuda.Event() if self.cuda else None
        self._key: Optional[bytes] = None
        self._sites: List[Tuple[int, int, int]] = []  # the step's (site, offset, rows)
        self._used = 0
        self.pending = False  # a prepared step's rows await collect()

    def index(self, site: int) -> Tuple[torch.Tensor, torch.Tensor]:
        """The persistent (source rows, buffer rows) of an attached site, ``[max_tokens]`` each."""
        slot = self.slot[site]
        return self._idx[0, slot], self._idx[1, slot]

    def check(self, plan: Optional[CapturePlan]) -> None:
        """BatchCapacityError when the step plans more rows than the buffers hold (nothing of
        this step will be captured)."""
        total = 0 if plan is None else len(plan.rows)
        if total > self.max_rows:
            self.pending, self._sites, self._used = False, [], 0
            raise BatchCapacityError(f"shmsteer: the step captures {total} rows over its sites, static capture holds "
                                     f"max_rows={self.max_rows}: start_capture(max_rows=...) larger")

    def plan(self, plan: Optional[CapturePlan]) -> None:
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
                assert plan is not None
                h[0, slot, :n] = plan.rows[off:off + n]
                h[1, slot, :n] = np.arange(off, off + n)
            self._idx.copy_(self._idx_host, non_blocking=self.cuda)
            self._key = key
        self._sites, self._used, self.pending = sites, total, total > 0

    def collect(self) -> List[Tuple[int, int, int]]:
        """After the replay: the step's one device-to-host copy of its captured rows (into
        pinned memory, asynchronous on CUDA, then waited for), and per site (site, host address,
        bytes) of its rows, valid until the next collect."""
        self.pending = False
        u = self._used
        self._host[:u].copy_(self.buf[:u], non_blocking=self.cuda)
        if self._done is not None:
            self._done.record()
            self._done.synchronize()
        row = self.hidden * self._host.element_size()
        base = self._host.data_ptr()
        return [(site, base + off * row, n * row) for site, off, n in self._sites]


class StaticHooks(SteeringHooks):
    """Static (CUDA-graph, torch.compile) mode: ``SteeringHooks(handle, static=True,
    max_tokens=T, device=..., dtype=...)``. Every attached site's tables (``[max_slots + 1,
    hidden]``, clamp rows when ``max_clamps`` > 0, gate add rows when ``max_row_gates`` > 0), the
    row index ``[max_tokens]`` and the gate buffers are allocated up front and never move.
    :meth:`prepare`, outside the forward, resolves the step and writes into them; the hooked
    forward does the same fixed sequence of :mod:`shmsteer.ops` calls on them every step (the
    capture, the probe gates, the gather-add and clamps, the gated adds; without clamps, within
    ``ADDEND_BYTES``, one add of the site's rows, which prepare gathers into a persistent buffer
    when the index or the tables change): no engine call, no
    branch on data, no host sync, so it can be captured in a CUDA graph or compiled with
    ``torch.compile(fullgraph=True)`` once and replayed every step."""

    def __init__(self, handle: Any, force_device_path: bool = False, *, max_tokens: int = 0, device: Any = None,
                 dtype: Optional[torch.dtype] = None, max_slots: int = 256, max_gate_slots: int = 64,
                 gate_sites: Optional[Sequence[Tuple[str, int]]] = None, **kw: Any) -> None:
        if max_tokens <= 0 or device is None or dtype is None:
            raise ValueError("shmsteer: static mode needs max_tokens > 0, device and dtype")
        if dtype not in (torch.float32, torch.bfloat16, torch.float16):
            raise UnsupportedDtypeError(f"shmsteer: static tables in {dtype}; use float32, bfloat16 or float16")
        super().__init__(handle, force_device_path, max_tokens=max_tokens, device=device, dtype=dtype,
                         max_slots=max_slots, max_gate_slots=max_gate_slots, **kw)
        self._hook_names = {handle.hook_id(h): h for h in handle.model[2]}  # the layout's ids
        self._fns: Dict[int, Callable[[torch.Tensor], None]] = {}  # each registered site's apply
        self._sealed = False
        dev = torch.device(device)
        self.dtype = dtype
        self._tables = DeviceTables(self.hidden, dev, dtype, self.max_clamps, capacity=max_slots + 1, static=True)
        self._sidx = torch.zeros(max_tokens, dtype=torch.int64, device=dev)
        self._device = self._sidx.device  # with its index (cuda:0)
        self._tdev = self._sidx.get_device()  # -1 on the CPU
        self._numel = max_tokens * self.hidden  # the most elements a hooked output may have
        self._sidx_host = torch.zeros(max_tokens, dtype=torch.int64, pin_memory=dev.type == "cuda")
        self._sidx_np = self._sidx_host.numpy()
        self._sidx_key = bytes(4 * max_tokens)  # the index the device buffer holds (int32 bytes; all slot 0)
        self._copied = torch.cuda.Event() if dev.type == "cuda" else None  # after the last index copy
        sites = None if gate_sites is None else frozenset(self.site_of(hk, layer) for hk, layer in gate_sites)
        self._gates = StaticGates(self.hidden, dev, dtype, max_tokens, self.max_row_gates, max_gate_slots, sites)
        self._scap: Optional[StaticCapture] = None  # made by start_capture
        # ops.steer_'s temporaries: the gather, and with clamps the gathered clamp rows, a
        # float32 copy of the rows and the clamp passes' buffers.
        T, H, K, f32 = max_tokens, self.hidden, self.max_clamps, torch.float32
        self._scratch = [torch.zeros(T, H, dtype=dtype, device=dev)]
        # Without clamps, each attached site's rows gathered by prepare (when the index or the
        # tables change) while they fit ADDEND_BYTES: such a site's forward is one add.
        self._addends: Dict[int, torch.Tensor] = {}
        self._addend_budget = ADDEND_BYTES if K == 0 else 0
        if K > 0:
            self._scratch += [torch.zeros(T, K, H, dtype=f32, device=dev), torch.zeros(T, K, 3, dtype=f32, device=dev),
                              torch.zeros(T, H, dtype=f32, device=dev), torch.zeros(T, H, dtype=f32, device=dev),
                              torch.zeros(2, T, dtype=f32, device=dev)]

    @property
    def mode(self) -> str:
        return "static"

    @property
    def uploads(self) -> int:
        return self._tables.uploads

    # ---- a layout's hooks: buffers first, the owner later ------------------------------------

    def register(self, hook: str, layer: int) -> int:
        """Attach site (hook, layer) without a module hook (the caller calls :meth:`apply`):
        its tables and buffers are allocated now. Returns the site number."""
        site = self.site_of(hook, layer)
        self._add_site(site)
        if site not in self._fns:
            self._fns[site] = self._site_fn(site)
        return site

    def apply(self, t: torch.Tensor, hook_id: int, layer: int) -> None:
        site = hook_id * self.layers + layer
        fn = self._fns.get(site)
        if fn is None:
            self._add_site(site)
            fn = self._fns[site] = self._site_fn(site)
        fn(t)

    def capture_buffers(self, max_rows: int = 0) -> None:
        """Allocate the capture buffers now (before :meth:`seal` and any graph capture; without
        a stepper): a later :meth:`start_capture` uses them. ``max_rows`` as start_capture's."""
        self._check_capture_start(max_rows)
        self._capture_started(max_rows)

    def seal(self) -> None:
        """No buffer is allocated from now on (the graphs may be captured): a new site or capture
        buffers are refused with a typed error instead."""
        self._sealed = True

    def bind(self, handle: Any) -> None:
        """Step through ``handle`` (a Client or Owner) from now on, keeping every buffer: built on
        a :class:`StaticLayout`, or again after the owner restarted. The previous handle's step
        state is dropped (its stepper closed, its capture stopped).

        Raises:
            StaticLayoutError: the handle's hidden size or layers differ, or an attached site's
                hook has another id there (nothing changed).
        """
        hidden, layers, _ = handle.model
        if (hidden, layers) != (self.hidden, self.layers):
            raise StaticLayoutError(f"shmsteer: static buffers are for hidden {self.hidden} x {self.layers} layers, "
                                    f"the owner's model is {hidden} x {layers}")
        for hid in sorted({s // self.layers for s in self._sites}):
            name = self._hook_names[hid]
            try:
                got = handle.hook_id(name)
            except ShmsteerError as e:
                raise StaticLayoutError(f"shmsteer: the owner has no hook {name!r} the static sites use: {e}") from None
            if got != hid:
                raise StaticLayoutError(f"shmsteer: hook {name!r} has id {got} in the owner, {hid} in the static "
                                        f"layout {[self._hook_names[i] for i in sorted(self._hook_names)]}: make "
                                        "the owner with that hook order")
        if self.bound:
            if self._capturing:
                self.stepper.capture_stop()
            self.batch.close()
            self.stepper.close()
        self._capturing = False
        self._gates.awaiting, self._gates.cols = False, 0
        if self._scap is not None:
            self._scap.pending, self._scap._key = False, None
        self._connect(handle)

    def _check_bound(self, what: str) -> None:
        if not self.bound:
            raise NotBoundError(f"shmsteer: {what}: static hooks built on a layout have no owner yet: bind(handle) first")

    def _check_new_site(self) -> None:
        if self._sealed:
            raise RuntimeError("shmsteer: static hooks are sealed (their graphs may be captured): register every "
                               "site before seal()")
        if self._scap is not None:
            raise RuntimeError("shmsteer: static capture's buffers hold the sites attached before start_capture; "
                               "attach every site first")

    def _site_fn(self, site: int) -> Callable[[torch.Tensor], None]:
        tb, g = self._tables, self._gates
        st = tb._site(site)
        if self.max_clamps > 0 and st.dirs is None:
            tb._clamp_rows(st)
        vec, dirs, params, k, index, scratch = st.vec, st.dirs, st.params, self.max_clamps, self._sidx, self._scratch
        adds = g.tables.add_table(site) if g.gated(site) else None
        probe, site_t = g.tables.probe, g.site_tensor(site)
        addend = self._addends.get(site)
        need = self.max_tokens * self.hidden * vec.element_size()
        if addend is None and need <= self._addend_budget:
            self._addend_budget -= need
            addend = self._addends[site] = torch.index_select(vec, 0, index)
        hidden = self.hidden
        # The addend's first rows per row count: an eager batch smaller than max_tokens slices
        # no view again (a slice out of the forward costs 5-15 us of torch's indexing).
        cuts: Dict[int, torch.Tensor] = {} if addend is None else {addend.shape[0]: addend}
        compiling = torch.compiler.is_compiling

        def apply(t: torch.Tensor) -> None:
            self._check(t)
            sc = self._scap
            if sc is not None:  # before the add: captures see the unsteered rows
                src, dst = sc.index(site)
                ops.capture_(t, src, dst, sc.buf, sc.scratch)
            if adds is not None:
                ops.gate_probe_(t, probe, g.slots, g.site, site_t, g.params, g.gate, g.score, g.probe_scratch)
            if addend is not None:
                h = t if t.dim() == 2 else t.view(-1, hidden)
                n = h.shape[0]
                if compiling():  # n may be symbolic: traced as it is
                    a = addend if n == addend.shape[0] else addend[:n]
                else:
                    a = cuts.get(n)
                    if a is None:
                        a = cuts[n] = addend[:n]
                ops.add_rows_(h, a)
            else:
                ops.steer_(t, vec, index, None, dirs, params, k, scratch)
            if adds is not None:
                ops.gate_add_(t, adds, g.slots, g.gate, g.add_scratch)
        return apply

    def _check(self, t: torch.Tensor) -> None:
        if (t.dtype is not self.dtype or t.get_device() != self._tdev or t.dim() == 0 or t.shape[-1] != self.hidden
                or not t.is_contiguous() or t.numel() > self._numel):
            self._refuse(t)

    def _refuse(self, t: torch.Tensor) -> None:
        """The typed error for a hooked output static mode cannot steer (nothing changed)."""
        if t.dtype is not self.dtype or t.get_device() != self._tdev:
            raise DeviceMismatchError(f"shmsteer: static tables are {self.dtype} on {self._device}, the hooked output is "
                                      f"{t.dtype} on {t.device}")
        check_hidden(t, self.hidden)
        if t.numel() // self.hidden > self.max_tokens:
            raise ShapeError(f"shmsteer: the hooked output has {t.numel() // self.hidden} rows, static mode holds "
                             f"max_tokens={self.max_tokens}")

    def prepare(self, spans: Sequence[SpanLike], version: int = 0) -> int:
        """Outside the graph, once per step: resolve the step (one engine call, the step ended at
        once) and copy what changed into the static buffers (changed table rows, the index, the
        gate columns, the capture plan; rows past the batch get slot 0). Returns the pinned
        version. The previous step's scores and captured rows are handed back first when
        :meth:`report` was not called."""
        self._check_bound("prepare")
        packed = self._packer.pack(spans)
        gates, sc = self._gates, self._scap
        if gates.awaiting or (sc is not None and sc.pending):
            self.report()
        res = self._resolve(packed, self.max_tokens, version, end=True)
        g = res.gates
        if (sc is None and gates.columns == 0 and not g.cols and not g.report and len(res.updates) == 0
                and res.slots <= self._tables.capacity):
            # The usual steady or advancing decode step: no table row, gate column or capture
            # plan to write, only the index when it changed.
            gates.awaiting, gates.cols = False, 0
            idx_key = res.index.tobytes()
            if idx_key != self._sidx_key:
                self._wait_copies()
                self._upload_index(res, idx_key)
                if self._copied is not None:
                    self._copied.record()
            return res.version
        self._tables.update(res)
        capture_plan = None
        if sc is not None:
            capture_plan = self.batch.capture_plan() if self._capturing else None
            sc.check(capture_plan)  # BatchCapacityError before any copy
        self._wait_copies()
        idx_key = res.index.tobytes()
        if idx_key != self._sidx_key:  # a steady or advancing decode batch copies nothing
            self._upload_index(res, idx_key)
        elif len(res.updates) > 0:
            self._gather_addends()
        if sc is not None:
            sc.plan(capture_plan)
        gates.awaiting, gates.cols = g.report, g.cols
        gates.check(g)
        gates.load(g)
        if self._copied is not None:
            self._copied.record()
        return res.version

    def _wait_copies(self) -> None:
        """The last step's copies read the pinned host buffers asynchronously: they must have run
        before the buffers are rewritten (normally long done; outside the graph)."""
        if self._copied is not None:
            self._copied.synchronize()

    def _upload_index(self, res: Any, idx_key: bytes) -> None:
        """The step's row index into the device buffer, then the addends it selects."""
        self._sidx_np[:] = res.index
        self._sidx.copy_(self._sidx_host, non_blocking=True)
        self._sidx_key = idx_key
        self._gather_addends()

    def _gather_addends(self) -> None:
        for site, addend in self._addends.items():
            torch.index_select(self._tables.sites[site].vec, 0, self._sidx, out=addend)

    def report(self) -> None:
        """After the replay: hand the last prepared step's gate scores and captured rows back
        (this waits for the device). prepare() does it for the previous step when it was not
        done; a step whose batch has no probe gates and captures nothing needs none."""
        self._capture_stopping()
        if not self._gates.awaiting:
            return
        self._gates.awaiting = False
        self._report(self._gates.scores())

    def _capture_stopping(self) -> None:
        sc = self._scap
        if sc is None or not sc.pending:
            return
        for site, ptr, n_bytes in sc.collect():
            self.batch.capture(site, sc.dtype, ptr, n_bytes)

    def _check_capture_start(self, max_rows: int) -> None:
        if not self._sites:
            raise ValueError("shmsteer: static capture: attach the hooks' sites before start_capture")
        if max_rows < 0:
            raise ValueError(f"shmsteer: max_rows {max_rows} is negative")

    def _capture_started(self, max_rows: int) -> None:
        if self._scap is None and self._sealed:
            if self.bound:
                self.stepper.capture_stop()
            self._capturing = False
            raise StaticCaptureError("shmsteer: the owner serves capture but the static hooks were sealed without "
                                     "capture buffers (capture_buffers() before seal()): nothing is captured")
        if self._scap is None:
            self._scap = StaticCapture(self._sites, self.max_tokens, max_rows or self.max_tokens * len(self._sites),
                                       self.hidden, self.dtype, self._device)


__all__ = ["StaticHooks", "StaticGates", "StaticCapture", "StaticLayout", "StaticLayoutError", "NotBoundError",
           "StaticCaptureError", "LAYOUT_HOOKS"]
