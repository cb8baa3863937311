"""The eager device path's components: its gate columns and its capture buffers.

Both are loaded once per step, outside the forward, from the step's resolve; at a hooked site
they only call :mod:`shmsteer.ops` on what they loaded.
"""

from __future__ import annotations

from typing import Dict, FrozenSet, List, Optional, Tuple

import numpy as np
import torch

from . import ops
from .device import CapturePlan, GateTables, ResolvedGates, StepBatch


class EagerGates:
    """A step's probe gates on the device path: the gate tables (kept current from resolves) and
    the step's columns, column-major ``[cols, rows]``: each row's gate slot, its probe site,
    threshold / sharpness / per-row factor, and the gate and score the sites compute."""

    def __init__(self, hidden: int) -> None:
        self.hidden = hidden
        self.tables: Optional[GateTables] = None
        self.cols = 0  #: gate columns of the step (0: no probe gate)
        self.awaiting = False  #: the step awaits its scores (StepBatch.report)
        self._probe_sites: FrozenSet[int] = frozenset()
        self._add_sites: FrozenSet[int] = frozenset()
        self._slots = self._sites = self._params = self._gate = self._score = torch.zeros(0)
        self._site_t: Dict[int, torch.Tensor] = {}  # each site as a 0-dim tensor on the tables' device

    def load(self, g: ResolvedGates, n: int, device: torch.device, dtype: torch.dtype) -> None:
        """Bring the gate tables up to date with a resolve of ``n`` rows and set up its columns."""
        self.awaiting, self.cols = g.report, g.cols
        self._probe_sites = self._add_sites = frozenset()
        if g.cols == 0 and not len(g.updates) and not len(g.adds):
            return
        if self.tables is None:
            self.tables = GateTables(self.hidden, device, dtype)
        gt = self.tables
        gt.update(g)
        if g.cols == 0:
            return
        rows = np.ascontiguousarray(g.rows[:n].T, dtype=np.int64)  # [cols, n]
        self._probe_sites = frozenset(s for s in np.unique(gt.site_host[rows]).tolist() if s >= 0)
        self._add_sites = frozenset(s for s, nz in gt.adds_host.items() if nz[rows].any())
        idx = torch.from_numpy(rows).to(device)
        flat = idx.view(-1)
        self._slots = idx
        self._sites = gt.site.index_select(0, flat).view(g.cols, n)
        self._params = torch.stack((gt.thr.index_select(0, flat), gt.sharp.index_select(0, flat),
                                    gt.per_row.index_select(0, flat))).view(3, g.cols, n)
        factor = np.ascontiguousarray(g.factor[:n].T)
        self._params[2].mul_(torch.from_numpy(factor).to(device))  # the rows' attenuation
        self._gate = torch.zeros(g.cols, n, dtype=torch.float32, device=device)
        self._score = torch.zeros(g.cols, n, dtype=torch.float32, device=device)

    def probe(self, t: torch.Tensor, site: int) -> None:
        """Before the site's gather-add: the columns probing here read their probes."""
        if site in self._probe_sites:
            assert self.tables is not None
            st = self._site_t.get(site)
            if st is None:
                st = self._site_t[site] = torch.tensor(site, dtype=torch.int64, device=self.tables.device)
            ops.gate_probe_(t, self.tables.probe, self._slots, self._sites, st, self._params, self._gate, self._score)

    def add(self, t: torch.Tensor, site: int) -> None:
        """After the site's gather-add: every column's gated add rows of this site."""
        if site in self._add_sites:
            assert self.tables is not None
            ops.gate_add_(t, self.tables.adds[site], self._slots, self._gate)

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
