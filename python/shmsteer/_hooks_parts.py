"""The eager device path's components: its gate columns and its capture buffers.

Both are loaded once per step, outside the forward, from the step's resolve; at a hooked site
they only call :mod:`shmsteer.ops` on what they loaded.
"""

from __future__ import annotations

from typing import Any, Dict, FrozenSet, List, NamedTuple, Optional, Set, Tuple

import numpy as np
import torch

from . import ops
from .device import CapturePlan, GateTables, ResolvedGates, StepBatch


class _ProbeSite(NamedTuple):
    """A site's probe gates this step: its distinct probe rows ``[U, hidden]`` (float32), each
    column's row in it ``pick [cols, rows]`` and where the column probes here ``here`` (None:
    every column in every row)."""
    probes: torch.Tensor
    pick: torch.Tensor
    here: Optional[torch.Tensor]


class _AddSite(NamedTuple):
    """A site's gated adds this step: its distinct non-zero add rows then a row of zeros
    ``[V + 1, hidden]`` (float32) and each column's row in it ``pick [cols, rows]`` (V: the
    column adds nothing here); pick None: only ``column`` adds here, ``adds[0]`` in every row.
    ``probes``: the sites whose probes set the gates of what adds here (until one of them has
    run in the step, every such gate is still 0: the site adds nothing). ``rows``: each
    column's gathered add rows ``adds[pick[k]]``, made at the layout's first eager add and
    kept while it holds (empty until then; a new layout makes a new entry)."""
    adds: torch.Tensor
    pick: Optional[torch.Tensor]
    column: int
    probes: FrozenSet[int]
    rows: List[torch.Tensor]


def _first_of(keys: List[Any]) -> Tuple[np.ndarray, List[int]]:
    """For each key, the index of its distinct value (in order of first appearance), and the
    position of each distinct value's first key."""
    seen: Dict[Any, int] = {}
    first: List[int] = []
    ids = np.empty(len(keys), np.int64)
    for i, k in enumerate(keys):
        u = seen.get(k)
        if u is None:
            u = seen[k] = len(first)
            first.append(i)
        ids[i] = u
    return ids, first


class EagerGates:
    """A step's probe gates on the device path: the gate tables (kept current from resolves) and
    the step's columns, column-major ``[cols, rows]`` (threshold / sharpness / per-row factor,
    the gate and score the sites compute), and per site a compact table: the distinct probe rows
    the columns read there (equal probes read once: one pass over the rows per distinct probe,
    not one per column) and the distinct add rows they add there. All of it is rebuilt only when
    the step's columns, factors or the tables change: a steady gated batch uploads nothing, and
    a batch whose rows are all rows of the last step (a request left, rows moved) re-indexes
    what it has (:meth:`_relayout`)."""

    def __init__(self, hidden: int) -> None:
        self.hidden = hidden
        self.tables: Optional[GateTables] = None
        self.cols = 0  #: gate columns of the step (0: no probe gate)
        self.awaiting = False  #: the step awaits its scores (StepBatch.report)
        self.builds = 0  #: times the per-site tables were rebuilt
        self.relayouts = 0  #: times they were re-indexed for rows the last layout had (_relayout)
        self._rows_np = np.zeros((0, 0), np.int32)  # the gate slots and factors of the rows they were made for
        self._factor_np = np.zeros((0, 0), np.float32)
        self._uploads = -1  # the gate tables' uploads they were made from
        self._key: Tuple[Any, ...] = ()  # the rows, columns, table uploads and factors the site tables were built for
        self._probe: Dict[int, _ProbeSite] = {}
        self._add: Dict[int, _AddSite] = {}
        self._probed: Set[int] = set()  # the probe sites run in this step
        self._params = self._gs = self._gate = self._score = torch.zeros(0)
        self._gate_cols: List[torch.Tensor] = []  # each gate column as a [rows, 1] view (add), per layout
        self._scratch: List[torch.Tensor] = []  # the operators' float32 [>= rows, hidden] products this step
        self._own_scratch: List[torch.Tensor] = []  # ours, when the hooks share none

    def load(self, g: ResolvedGates, n: int, device: torch.device, dtype: torch.dtype,
             share: Optional[torch.Tensor] = None) -> None:
        """Bring the gate tables up to date with a resolve of ``n`` rows and set up its columns.
        ``share``: a float32 buffer of at least ``n`` rows on the device, free while the
        operators run (the step's gather buffer), for their products; else their own."""
        self.awaiting, self.cols = g.report, g.cols
        self._probed.clear()
        if g.cols == 0 and not len(g.updates) and not len(g.adds):
            return
        if self.tables is None:
            self.tables = GateTables(self.hidden, device, dtype)
        gt = self.tables
        gt.update(g)
        if g.cols == 0:
            return
        rows, factor = g.rows[:n], g.factor[:n]
        key = (n, g.cols, gt.uploads, rows.tobytes(), factor.tobytes())
        if key == self._key:
            self._gs.zero_()  # the step's gates and scores
        else:
            if not self._relayout(rows, factor, n, gt.uploads, device):
                self._build(rows, factor, n, device)
            self._key = key
            self._rows_np, self._factor_np, self._uploads = rows.copy(), factor.copy(), gt.uploads
        if share is not None:
            self._scratch = [share]
        elif not self._own_scratch or self._own_scratch[0].shape[0] < n or self._own_scratch[0].device != device:
            self._scratch = self._own_scratch = [torch.empty(max(n, 1), self.hidden, dtype=torch.float32, device=device)]
        else:
            self._scratch = self._own_scratch

    def _build(self, rows: np.ndarray, factor: np.ndarray, n: int, device: torch.device) -> None:
        gt = self.tables
        assert gt is not None
        cols = rows.shape[1]
        slots = np.ascontiguousarray(rows.T, dtype=np.int64)  # [cols, n]
        site_of = gt.site_host[slots]
        self._probe = {}
        for site in np.unique(site_of[site_of >= 0]).tolist():
            here = site_of == site
            used = np.unique(slots[here])
            ids, first = _first_of([gt.probe_bytes.get(s, s) for s in used.tolist()])
            lut = np.zeros(gt.capacity, np.int64)
            lut[used] = ids
            probes = gt.probe.index_select(0, torch.from_numpy(used[first]).to(device))
            here_t = None if here.all() else torch.from_numpy(here).to(device)
            self._probe[site] = _ProbeSite(probes, torch.from_numpy(lut[slots]).to(device), here_t)
        self._add = {}
        for site, nonzero in gt.adds_host.items():
            hit = nonzero[slots]
            if not hit.any():
                continue
            probes = frozenset(site_of[hit & (site_of >= 0)].tolist())
            used = np.unique(slots[hit])
            lut = np.full(gt.capacity, len(used), np.int64)
            lut[used] = np.arange(len(used))
            adds = torch.zeros(len(used) + 1, self.hidden, dtype=torch.float32, device=device)
            adds[:-1] = gt.adds[site].index_select(0, torch.from_numpy(used).to(device))
            adding = np.flatnonzero(hit.any(axis=1))
            if len(used) == 1 and len(adding) == 1 and hit[adding[0]].all():  # one column, one row: no weights to sum
                self._add[site] = _AddSite(adds, None, int(adding[0]), probes, [])
            else:
                self._add[site] = _AddSite(adds, torch.from_numpy(lut[slots]).to(device), -1, probes, [])
        flat = torch.from_numpy(slots).to(device).view(-1)
        self._params = torch.stack((gt.thr.index_select(0, flat), gt.sharp.index_select(0, flat),
                                    gt.per_row.index_select(0, flat))).view(3, cols, n)
        self._params[2].mul_(torch.from_numpy(np.ascontiguousarray(factor.T)).to(device))  # the rows' attenuation
        self._gs = torch.zeros(2, cols, n, dtype=torch.float32, device=device)
        self._gate, self._score = self._gs[0], self._gs[1]
        self._gate_cols = []
        self.builds += 1

    def _relayout(self, rows: np.ndarray, factor: np.ndarray, n: int, uploads: int, device: torch.device) -> bool:
        """A layout each of whose rows is a row of the last one (the same gate slot and factor in
        every column: a request left, or the rows moved), over unchanged gate tables: every
        per-site table depends on a row's slots and factors only, so each is the last one's
        indexed by the old row of each new row (its probe and add rows, a superset of what the
        new rows use, stay). One gather per table instead of a rebuild. False (nothing changed)
        when that does not hold."""
        old, cols = self._rows_np, rows.shape[1]
        if uploads != self._uploads or n == 0 or old.shape[1] != cols or len(old) == 0 or cols == 0:
            return False
        w = 8 * cols  # a row's bytes: its slots, then its factors' bits
        ob = np.concatenate((old, self._factor_np.view(np.int32)), axis=1).tobytes()
        nb = np.concatenate((rows, factor.view(np.int32)), axis=1).tobytes()
        first: Dict[bytes, int] = {}
        for i in range(len(old) - 1, -1, -1):
            first[ob[i * w:(i + 1) * w]] = i
        at_old = []
        for j in range(n):
            i = first.get(nb[j * w:(j + 1) * w])
            if i is None:
                return False  # a row the last layout did not have
            at_old.append(i)
        at = torch.tensor(at_old, dtype=torch.int64, device=device)
        self._probe = {site: e._replace(pick=e.pick.index_select(1, at),
                                        here=None if e.here is None else e.here.index_select(1, at))
                       for site, e in self._probe.items()}
        self._add = {site: e if e.pick is None else e._replace(pick=e.pick.index_select(1, at), rows=[])
                     for site, e in self._add.items()}
        self._params = self._params.index_select(2, at)
        self._gs = torch.zeros(2, cols, n, dtype=torch.float32, device=device)
        self._gate, self._score = self._gs[0], self._gs[1]
        self._gate_cols = []
        self.relayouts += 1
        return True

    def probe(self, t: torch.Tensor, site: int) -> None:
        """Before the site's gather-add: the columns probing here read their probes."""
        e = self._probe.get(site)
        if e is not None:
            self._probed.add(site)
            ops.site_gate_probe_(t, e.probes, e.pick, e.here, self._params, self._gate, self._score, self._scratch)

    def add(self, t: torch.Tensor, site: int) -> None:
        """After the site's gather-add: every column's gated add rows of this site. Eager, each
        column's add rows are gathered once per layout (``_AddSite.rows``) and each step adds
        them weighted by the column's gates: one ``addcmul_`` a column, what
        ``ops.site_gate_add_`` computes (the same bits), without its gather and views."""
        e = self._add.get(site)
        if e is None or e.probes.isdisjoint(self._probed):
            return
        if e.pick is None or torch.compiler.is_compiling():
            ops.site_gate_add_(t, e.adds, e.pick, e.column, self._gate, self._scratch)
            return
        if not e.rows:
            e.rows.extend(e.adds.index_select(0, p) for p in e.pick)
        cols = self._gate_cols
        if not cols:
            cols.extend(g.unsqueeze(1) for g in self._gate)
        n = self._gate.shape[1]
        h = t if t.dim() == 2 else t.view(-1, self.hidden)
        if h.shape[0] != n:
            h = h[:n]
        for g, a in zip(cols, e.rows):
            h.addcmul_(g, a)

    def scores(self) -> Optional[torch.Tensor]:
        """The step's scores, ``[rows, cols]`` (None without columns)."""
        return self._score.t() if self.cols else None


class EagerCapture:
    """The device path's capture of one step: the plan's row indices on the device, one device
    buffer the sites gather their planned rows into (``ops.capture_``), and, at the step's end,
    one device-to-host copy (into pinned memory on CUDA) handed to the engine per site."""

    def __init__(self, hidden: int) -> None:
        self.hidden = hidden
        self.plan: Optional[CapturePlan] = None  #: the step's plan (None: nothing to capture)
        self._key = b""
        self._idx: Dict[int, Tuple[torch.Tensor, torch.Tensor]] = {}  # site -> (source rows, buffer rows)
        self._dev: Optional[torch.device] = None
        self._buf: Optional[torch.Tensor] = None
        self._host: Optional[torch.Tensor] = None
        self._done: List[int] = []  # the sites gathered this step

    def set_plan(self, plan: Optional[CapturePlan]) -> None:
        """The step's plan, right after its resolve."""
        self.plan = plan

    def _index(self, device: torch.device) -> None:
        plan = self.plan
        assert plan is not None
        key = plan.key()
        if key == self._key and device == self._dev:
            return
        src = torch.from_numpy(plan.rows.astype(np.int64)).to(device)
        dst = torch.arange(len(plan.rows), dtype=torch.int64, device=device)
        self._idx = {}
        for i, site in enumerate(plan.sites.tolist()):
            off, end = int(plan.start[i]), int(plan.start[i + 1])
            if end > off:
                self._idx[site] = (src[off:end], dst[off:end])
        self._key, self._dev = key, device

    def site(self, t: torch.Tensor, site: int) -> None:
        """Before the site's add: its planned rows of t into the device buffer."""
        if self.plan is None:
            return
        self._index(t.device)
        e = self._idx.get(site)
        if e is None:
            return
        total = len(self.plan.rows)
        buf = self._buf
        if buf is None or buf.shape[0] < total or buf.dtype != t.dtype or buf.device != t.device:
            buf = self._buf = torch.empty(max(total, 1), self.hidden, dtype=t.dtype, device=t.device)
        ops.capture_(t, e[0], e[1], buf)
        self._done.append(site)

    def flush(self, batch: StepBatch) -> None:
        """At the step's end: one device-to-host copy of the gathered rows, each site's to the
        engine."""
        done, self._done = self._done, []
        plan, buf = self.plan, self._buf
        if not done or plan is None or buf is None:
            return
        total = len(plan.rows)
        cuda = buf.is_cuda
        host = self._host
        if host is None or host.shape[0] < total or host.dtype != buf.dtype or (cuda and not host.is_pinned()):
            host = self._host = torch.empty(max(total, 1), self.hidden, dtype=buf.dtype, pin_memory=cuda)
        host[:total].copy_(buf[:total], non_blocking=cuda)
        if cuda:
            torch.cuda.current_stream(buf.device).synchronize()
        row = self.hidden * host.element_size()
        for site in done:
            r = plan.site_rows(site)
            if r is not None:
                batch.capture(site, host.dtype, host.data_ptr() + r[0] * row, r[1] * row)


__all__ = ["EagerGates", "EagerCapture"]
