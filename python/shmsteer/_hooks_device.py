"""The eager device path: per-site tables on the hooked tensors' device, one gather-add a site."""

from __future__ import annotations

from typing import Any, Callable, Dict, List, NamedTuple, Optional, Sequence, Set, Tuple

import numpy as np
import torch

from . import ops
from ._hooks_base import ADDEND_BYTES, DeviceMismatchError, SteeringHooks
from ._hooks_parts import EagerCapture, EagerGates
from .client import SpanLike
from .device import INDEX_ROWS, DeviceTables, Resolved, check_hidden
from .errors import ShapeError


class _SiteOp(NamedTuple):
    """A steered site's tables this step: vectors, clamp directions (0: a plain add), clamp rows."""
    vec: torch.Tensor
    clamps: int
    dirs: Optional[torch.Tensor]
    params: Optional[torch.Tensor]


class DeviceHooks(SteeringHooks):
    """The device path (CUDA tensors, or CPU ones with ``force_device_path``): per site a table
    ``[slots + 1, hidden]`` in the hidden state's dtype (made on the first hooked site, on its
    device), updated only for the rows whose content changed; the row index uploaded when the
    batch layout changes (its rows and slots listed by the ``_faststep`` extension when built);
    per site one ``torch.ops.shmsteer.steer_`` (gather-add, then clamps), or, at a clamp-free
    site, a gather kept at the first step of a batch layout and tables (one gather of every
    site's table) and one add of it at that step and the next ones (``ADDEND_BYTES``); with
    the gate and capture operators where the step has them. Each step is one engine call (the
    resolve, which ends the step), plus one report when the step has probe gates. One dtype
    on one device per hooks object (another is :class:`DeviceMismatchError`)."""

    def __init__(self, handle: Any, force_device_path: bool = False, **kw: Any) -> None:
        super().__init__(handle, force_device_path, **kw)
        dev = kw.get("device")
        self._device: Optional[torch.device] = None if dev is None else torch.device(dev)  # the device asked for
        self._tables: Optional[DeviceTables] = None
        self._tdev = -1  # the tables' device as Tensor.get_device() reports it
        self._row_bytes = 0  # a table row's bytes (the tables' dtype)
        self._on_cpu = True  # the tables are on the CPU (no index upload)
        self._gates = EagerGates(self.hidden)
        self._capture = EagerCapture(self.hidden)
        self._in_step = False
        self._ran = False  # a hooked site ran in this step
        self._rows = 0
        self._numel = 0  # the elements a hooked output of this step has at least (rows x hidden)
        self._res: Optional[Resolved] = None  # this step's resolve, until the tables load it
        self._pending = False  # the last resolve's updates are not in the tables yet
        self._stale = False  # a resolve's updates were dropped: the next one resets the batch
        self._ops: Dict[int, _SiteOp] = {}  # this step's steered sites
        self._sites_key = b""  # the steered sites and clamp counts _ops was built for
        self._idx_key = b""  # the index _idx was uploaded from
        self._idx: torch.Tensor = torch.zeros(0, dtype=torch.int64)  # the slot of each steered row
        self._rowsel: Optional[torch.Tensor] = None  # the steered rows (None: every row)
        self._gather: Optional[torch.Tensor] = None  # the gather buffer every site of a step reuses
        self._gather_rows = 0  # its rows
        self._scratch: List[torch.Tensor] = []  # ops.steer_'s: the gather buffer's view of the steered rows
        self._scratches: Dict[int, List[torch.Tensor]] = {}  # _scratch per k, for the gather buffer kept
        self._addends: Dict[int, torch.Tensor] = {}  # per clamp-free site, its gathered rows (_plan_addends)
        self._due: Set[int] = set()  # the sites whose gathered rows the layout's first step keeps
        self._stacked = False  # _due's rows come from one gather of every site's table (_keep_rows)
        self._index_rows = INDEX_ROWS  # the extension's (None: numpy's); set per hooks by tests
        self._host_idx: Optional[torch.Tensor] = None  # int64 [2 * cap]: the steered rows, then their slots
        self._host_at = (0, 0)  # its address and cap
        self._host_views: Dict[int, Tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = {}  # per k (_host_rows)
        self._k = 0  # the steered rows of the layout

    @property
    def mode(self) -> str:
        return "device"

    @property
    def uploads(self) -> int:
        return self._tables.uploads if self._tables is not None else 0

    def _step_begin(self, spans: Sequence[SpanLike], version: int, rows: Optional[int]) -> None:
        packed = self._packer.pack(spans)
        n = rows if rows is not None else packed.rows
        self._rows = n  # before the load: the gate columns are this step's rows
        self._numel = n * self.hidden
        res = self._resolve(packed, n, version, end=True, reset=self._stale)
        self._stale, self._res, self._pending = False, res, True
        self._capture.set_plan(self.batch.capture_plan() if self._capturing else None)
        if self._tables is not None:
            self._load(res)
        self._in_step, self._ran = True, False

    def _step_end(self) -> None:
        self._in_step = False
        self._capture.flush(self.batch)
        if self._gates.awaiting:
            self._gates.awaiting = False
            if self._ran:  # a step whose forward never reached a site leaves its report missed
                self._report(self._gates.scores())
        if self._pending:
            self._stale, self._pending = True, False
        self._res = None

    def _load(self, res: Resolved) -> None:
        """Bring the tables up to date with res and upload the step's index. A step whose sites
        and index equal the last one's (a steady decode batch) reuses them."""
        tb = self._tables
        assert tb is not None
        tb.update(res)
        self._pending = False
        self._load_index(res, tb)
        # A float32 gather buffer (the tables' dtype) doubles as the gates' products (fewer lines
        # touched a step).
        share = self._gather if tb.dtype is torch.float32 and self._gather_rows >= self._rows else None
        self._gates.load(res.gates, self._rows, tb.device, tb.dtype, share)

    def _load_index(self, res: Resolved, tb: DeviceTables) -> None:
        changed = len(res.updates) > 0
        sites_key = res.sites.tobytes() + res.site_clamps.tobytes()
        if changed or sites_key != self._sites_key:
            self._ops = {}
            for site, k in zip(res.sites.tolist(), res.site_clamps.tolist()):
                st = tb.sites[site]
                self._ops[site] = _SiteOp(st.vec, k, st.dirs if k else None, st.params if k else None)
            self._sites_key = sites_key
            changed = True
        if not self._ops:
            self._idx_key = b""
            self._addends, self._due = {}, set()
            return
        idx = res.index
        idx_key = idx.tobytes()
        if idx_key != self._idx_key:
            self._upload_index(res, tb)
            self._idx_key = idx_key
            changed = True
        if changed:
            self._plan_addends()

    def _upload_index(self, res: Resolved, tb: DeviceTables) -> None:
        idx = res.index
        n = len(idx)
        if self._index_rows is not None and n:
            k, rowsel, index, both = self._host_rows(res.index_addr, n, tb)
        else:
            nz = np.flatnonzero(idx)
            k = len(nz)
            both = torch.from_numpy(np.stack((nz, idx[nz])).astype(np.int64))
            rowsel, index = both[0], both[1]
        if not self._on_cpu:
            both = both.to(tb.device)  # one upload
            rowsel, index = both[0], both[1]
        self._rowsel = None if k == n else rowsel
        self._idx = index
        self._k = k
        # One gather buffer for every site of the step (and the next steps of its size): the
        # sites allocate nothing for the add. Its view of k rows is kept per k: a batch whose
        # size goes back and forth makes none (a torch call out of the forward costs 10-20 us).
        sc = self._scratches.get(k)
        if sc is None:
            g = self._gather
            if g is None or g.shape[0] < k:  # one dtype on one device a hooks object: the tables'
                g = self._gather = torch.empty(max(k, 1), self.hidden, dtype=tb.dtype, device=tb.device)
                self._gather_rows, self._scratches = g.shape[0], {}
            sc = self._scratches[k] = [g[:k]]
        self._scratch = sc

    def _host_rows(self, addr: int, n: int, tb: DeviceTables) -> Tuple[int, torch.Tensor, torch.Tensor, torch.Tensor]:
        """The steered rows of the n-row index at addr and their slots, written by the extension
        into a kept int64 host buffer (pinned for a CUDA upload) as one contiguous [2, k] block:
        their count k and the buffer's views of the rows, the slots and both, kept per k. On the
        CPU these views are the step's index: rewritten at the next layout, when the gathers of
        this one are done (eager CPU ops)."""
        buf = self._host_idx
        if buf is None or buf.shape[0] < 2 * n:
            cap = max(n, 64) if buf is None else max(n, buf.shape[0])
            buf = self._host_idx = torch.empty(2 * cap, dtype=torch.int64, pin_memory=tb.device.type == "cuda")
            self._host_views = {}
            self._host_at = (buf.data_ptr(), cap)
        k = self._index_rows(addr, n, *self._host_at)
        v = self._host_views.get(k)
        if v is None:
            v = self._host_views[k] = (buf[:k], buf[k:2 * k], buf[:2 * k].view(2, k))
        return (k,) + v

    def _plan_addends(self) -> None:
        """Which clamp-free sites keep their gathered rows ``table[index]`` for this batch layout
        and tables (a steady or advancing decode batch keeps them): its hook then does one add,
        not a gather and an add. The layout's first step gathers them in the forward (no gather
        ahead of it): all at its first such site, in one gather of every site's table
        (:meth:`DeviceTables.gather`), while every table's rows fit ``ADDEND_BYTES`` together;
        else each at its site, while they fit it (the first sites in order), the sites past it
        gathering at each step."""
        plain = [site for site, op in self._ops.items() if not op.clamps]
        need = self._k * self._row_bytes
        tb = self._tables
        assert tb is not None
        # One gather of every table (stacked) at the first of them: while it fits the budget
        # (it takes the sites this step does not steer or clamps too) and saves a gather.
        self._stacked = len(plain) > 1 and len(tb.order) * need <= ADDEND_BYTES
        if plain and need and not self._stacked:
            del plain[ADDEND_BYTES // need:]
        self._addends, self._due = {}, set(plain)

    def _keep_rows(self, site: int) -> torch.Tensor:
        """A due site's rows of this layout, gathered at the layout's first step and kept (with
        every other due site's, in one gather of all the tables, when stacked)."""
        if not self._stacked:
            self._due.discard(site)
            add = self._addends[site] = self._ops[site].vec.index_select(0, self._idx)
            return add
        tb = self._tables
        assert tb is not None
        rows, pos = tb.gather(self._idx).unbind(0), tb.pos
        for s in self._due:
            self._addends[s] = rows[pos[s]]
        self._due = set()
        return self._addends[site]

    def _first_site(self, t: torch.Tensor) -> DeviceTables:
        """The first hooked site: tables on its device, in its dtype, loaded with this step."""
        if self._device is not None and t.device.type != self._device.type:
            raise DeviceMismatchError(f"shmsteer: hooks built for {self._device} got a tensor on {t.device}")
        tb = self._tables = DeviceTables(self.hidden, t.device, t.dtype, self.max_clamps, site_capacity=len(self._sites))
        self._tdev = t.get_device()
        self._row_bytes = self.hidden * t.element_size()
        self._on_cpu = t.device.type == "cpu"
        if self._res is not None:
            self._load(self._res)
        return tb

    def _site_fn(self, site: int) -> Callable[[torch.Tensor], None]:
        hidden, capture, gates = self.hidden, self._capture, self._gates

        def apply(t: torch.Tensor) -> None:
            tb, addends = self._tables, self._addends
            # The checks of _check, fast when they pass (this runs at every site of every step).
            if (tb is None or not self._in_step or t.dtype is not tb.dtype or t.get_device() != self._tdev
                    or t.dim() == 0 or t.shape[-1] != hidden or not t.is_contiguous() or t.numel() < self._numel):
                self._check(t)
            self._ran = True
            if capture.plan is not None:
                capture.site(t, site)  # before the add: captures see the unsteered rows
            if gates.cols:
                gates.probe(t, site)
            add = addends.get(site)
            if add is None and site in self._due:  # this layout's first step: gather and keep
                add = self._keep_rows(site)
            if add is not None:  # a clamp-free site whose rows are gathered already (_plan_addends)
                rowsel = self._rowsel
                h = t if t.dim() == 2 else t.view(-1, hidden)
                if rowsel is not None:
                    h.index_add_(0, rowsel, add)
                else:
                    ops.add_rows_(h if h.shape[0] == add.shape[0] else h[: add.shape[0]], add)
            else:
                op = self._ops.get(site)
                if op is not None:
                    ops.steer_(t, op.vec, self._idx, self._rowsel, op.dirs, op.params, op.clamps, self._scratch)
            if gates.cols:
                gates.add(t, site)
        return apply

    def _check(self, t: torch.Tensor) -> None:
        """Refuse a hooked output the step cannot steer, before anything changes; make the
        tables at the first site."""
        if not self._in_step:
            raise RuntimeError("shmsteer: steering hook ran outside SteeringHooks.step()")
        check_hidden(t, self.hidden)
        if t.numel() // self.hidden < self._rows:
            raise ShapeError(f"shmsteer: the spans cover {self._rows} rows, the hooked output has {t.numel() // self.hidden}")
        tb = self._tables if self._tables is not None else self._first_site(t)
        if t.dtype is not tb.dtype or t.get_device() != self._tdev:
            raise DeviceMismatchError(
                f"shmsteer: the device tables are {tb.dtype} on {tb.device}, this site's output is {t.dtype} on {t.device}: "
                "steer one dtype on one device per SteeringHooks")


__all__ = ["DeviceHooks"]
