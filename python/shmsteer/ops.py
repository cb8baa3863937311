"""The steering add as torch operators (``torch.library``), for ``torch.compile`` and CUDA graphs.

Every hooked site of the device path and of static (CUDA-graph) mode does its work through these
six operators, on tensors only: no call into the engine, no Python branch on tensor data, no
host sync. What a step steers is written into the tensors they read (tables, row indices, gate
buffers) by the per-step work outside the forward (``SteeringHooks.step`` / ``prepare``).

``torch.ops.shmsteer.steer_(hidden, table, index, rowsel, dirs, params, clamps, scratch)``
    ``hidden`` (viewed as ``[rows, H]``) gets ``table[index]`` added in place: with ``rowsel``
    None the first ``m = min(rows, len(index))`` rows get ``table[index[:m]]`` (static mode
    passes its ``[max_tokens]`` index and every captured batch size takes its prefix); with
    ``rowsel`` row ``rowsel[i]`` gets ``table[index[i]]``. Then, with ``clamps`` > 0 and the
    clamp tables ``dirs [S, K, H]`` / ``params [S, K, 3]`` (float32), the first ``clamps``
    records of each steered row's slot, in float32: ``p = h·u; h += strength * (clip(p, lo, hi) -
    p) * u``.
``torch.ops.shmsteer.gate_probe_(hidden, probe, slots, sites, site, params, gate, score, scratch)``
    Probe gates read before the site's add: for each gate column ``k`` of ``slots [G, T]`` (gate
    slot per row, column-major) whose ``sites[k, t]`` is ``site``: ``score[k, t] = h[t] ·
    probe[slots[k, t]]`` and ``gate[k, t] = params[2, k, t] * sigmoid(params[1, k, t] *
    (score - params[0, k, t]))`` (threshold, sharpness, per-row factor); other entries keep
    their values (``site`` is a 0-dim int64 tensor). Mutates ``gate`` and ``score``.
``torch.ops.shmsteer.gate_add_(hidden, adds, slots, gate, scratch)``
    After the site's add: ``h[t] += gate[k, t] * adds[slots[k, t]]`` for every column ``k``, in
    column order, each in float32 rounded once to the hidden dtype (one ``addcmul_``).
``torch.ops.shmsteer.site_gate_probe_(hidden, probes, pick, here, params, gate, score, scratch)``
    The probe gates of one site through its compact probe table ``probes [U, H]`` (float32; the
    distinct probe rows the step's columns read at this site), over the first ``n`` rows, where
    ``pick``, ``here``, ``params[i]``, ``gate`` and ``score`` are ``[G, n]``: one pass over the
    rows per table row, ``S[t, u] = sum(h[t] * probes[u])`` in float32 (the product summed
    along the row, as ``gate_probe_`` computes each dot, so scores and decisions are the same
    bits); then, where ``here[k, t]`` (bool; None: everywhere), ``score[k, t] = S[t, pick[k,
    t]]`` and ``gate[k, t]`` as ``gate_probe_``; other entries keep their values.
``torch.ops.shmsteer.site_gate_add_(hidden, adds, pick, column, gate, scratch)``
    The gated adds of one site through its compact add table ``adds [V + 1, H]`` (float32: the
    distinct non-zero add rows the step's columns add here, then a row of zeros), over the
    first ``n`` rows (``gate [G, n]``): for each column ``k``, ``h[t] += gate[k, t] *
    adds[pick[k, t]]`` (``V``: the column adds nothing here): one gather of the table and one
    multiply-add over the rows per column, as ``gate_add_`` (the same bits). ``pick`` None:
    column ``column`` adds ``adds[0]`` in every row, and only it.
``torch.ops.shmsteer.capture_(hidden, src, dst, buf, scratch)``
    Before the site's add: ``buf[dst[i]] = h[src[i]]`` for the first ``min(rows, len(src))``
    entries (a capture consumer's rows, copied to the host after the forward).

``scratch`` is a list of preallocated temporaries (mutated; their contents are garbage after the
call): empty, and the kernels allocate what they need; static mode passes persistent buffers of
``max_tokens`` rows so its forward allocates nothing (see each kernel for the list it takes).

Each has a fake (meta) kernel, so ``torch.compile(model, fullgraph=True)`` traces a model with
the hooks attached without a graph break, and the captured graph calls the operators, except
static mode's ``steer_`` (no ``rowsel``): compiled, it traces its arithmetic as aten ops, which
the compiler fuses into the loops around the site (:func:`steer_`). Eagerly
(not compiling) the hooks call the same kernels directly (:func:`steer_` etc. below): the
dispatcher's Python round trip of a ``custom_op`` costs tens of microseconds a call, more than a
decode step's gather-add at a small batch, and the arithmetic is the same code either way.
"""

from __future__ import annotations

from typing import List, Optional

import torch

from ._torchreq import require_torch

require_torch(torch.__version__)

from .device import apply_clamps  # noqa: E402

Tensor = torch.Tensor


def _steer_kernel(hidden: Tensor, table: Tensor, index: Tensor, rowsel: Optional[Tensor], dirs: Optional[Tensor],
                  params: Optional[Tensor], clamps: int, scratch: List[Tensor]) -> None:
    h = hidden if hidden.dim() == 2 else hidden.view(-1, table.shape[1])
    if rowsel is None:
        m, n = index.shape[0], h.shape[0]  # len() of a tensor costs 1.3 us, .shape[0] 0.3
        if m == n:
            idx, dst = index, h
        elif m < n:
            idx, dst = index, h[:m]
        else:
            m = n
            idx, dst = index[:m], h
    else:
        m, idx, dst = index.shape[0], index, h
    if scratch:  # a gather buffer of at least m rows: the gather allocates nothing
        g = scratch[0]
        if g.shape[0] != m:
            g = g[:m]
        torch.index_select(table, 0, idx, out=g)
    else:
        g = table.index_select(0, idx)
    if rowsel is None:
        dst.add_(g)
    else:
        h.index_add_(0, rowsel, g)
    if clamps <= 0 or dirs is None or params is None:
        return
    if rowsel is None and len(scratch) >= 6:  # static mode: every temporary preallocated
        d, p, x, tmp, pc = scratch[1][:m], scratch[2][:m], scratch[3][:m], scratch[4][:m], scratch[5][:, :m]
        torch.index_select(dirs, 0, idx, out=d)
        torch.index_select(params, 0, idx, out=p)
        if h.dtype is torch.float32:
            apply_clamps(dst, d, p, clamps, tmp, pc)
            return
        x.copy_(dst)
        apply_clamps(x, d, p, clamps, tmp, pc)
        dst.copy_(x)
        return
    d = dirs.index_select(0, idx)
    p = params.index_select(0, idx)
    if rowsel is None:
        if h.dtype is torch.float32:
            apply_clamps(dst, d, p, clamps)
            return
        x = dst.float()
        apply_clamps(x, d, p, clamps)
        dst.copy_(x)
        return
    x = h.index_select(0, rowsel).float()
    apply_clamps(x, d, p, clamps)
    h.index_copy_(0, rowsel, x.to(h.dtype))


def _gate_probe_kernel(hidden: Tensor, probe: Tensor, slots: Tensor, sites: Tensor, site: Tensor, params: Tensor,
                       gate: Tensor, score: Tensor, scratch: List[Tensor]) -> None:
    h = hidden.view(-1, probe.shape[1])
    n = min(h.shape[0], slots.shape[1])
    if scratch:  # static mode: p, h (float32 [T, hidden]), s, v (float32 [T]), m (bool [T])
        p, hf, s, v, m = scratch[0][:n], scratch[1][:n], scratch[2][:n], scratch[3][:n], scratch[4][:n]
        if h.dtype is torch.float32:
            hf = h[:n]
        else:
            hf.copy_(h[:n])
    else:
        hf = h[:n].float()  # float32 rows: the rows themselves
    for k in range(slots.shape[0]):
        if scratch:
            torch.index_select(probe, 0, slots[k, :n], out=p)
            torch.mul(hf, p, out=p)
            torch.sum(p, 1, out=s)
            torch.eq(sites[k, :n], site, out=m)
            torch.sub(s, params[0, k, :n], out=v)
        else:
            s = (hf * probe.index_select(0, slots[k, :n])).sum(1)
            m = sites[k, :n] == site
            v = s - params[0, k, :n]
        sc, g = score[k, :n], gate[k, :n]
        torch.where(m, s, sc, out=sc)
        v.mul_(params[1, k, :n]).sigmoid_().mul_(params[2, k, :n])
        torch.where(m, v, g, out=g)


def _gate_add_kernel(hidden: Tensor, adds: Tensor, slots: Tensor, gate: Tensor, scratch: List[Tensor]) -> None:
    h = hidden.view(-1, adds.shape[1])
    n = min(h.shape[0], slots.shape[1])
    rows = h[:n]
    for k in range(slots.shape[0]):
        if scratch:  # static mode: a ([T, hidden], the table's dtype)
            a = scratch[0][:n]
            torch.index_select(adds, 0, slots[k, :n], out=a)
        else:
            a = adds.index_select(0, slots[k, :n])
        rows.addcmul_(gate[k, :n].unsqueeze(1), a)  # in float32 (the gate's), rounded once to the hidden's dtype


def _site_gate_probe_kernel(hidden: Tensor, probes: Tensor, pick: Tensor, here: Optional[Tensor], params: Tensor,
                            gate: Tensor, score: Tensor, scratch: List[Tensor]) -> None:
    n = gate.shape[1]
    h = hidden if hidden.dim() == 2 else hidden.view(-1, probes.shape[1])
    if h.shape[0] != n:
        h = h[:n]
    hf = h if h.dtype is torch.float32 else h.float()
    # scratch: p (float32 [>= n, hidden]), the products; without it they are allocated.
    p = (scratch[0] if scratch[0].shape[0] == n else scratch[0][:n]) if scratch else torch.empty_like(hf)
    u_rows = probes.shape[0]
    if u_rows == 1:
        vals = torch.sum(torch.mul(hf, probes[0], out=p), 1)  # [n], every column's (broadcast)
    else:
        s = torch.empty(u_rows, n, dtype=torch.float32, device=hf.device)
        for u in range(u_rows):
            torch.sum(torch.mul(hf, probes[u], out=p), 1, out=s[u])
        vals = torch.gather(s, 0, pick)
    if here is None:  # every column probes here
        score.copy_(vals)
        torch.sub(vals, params[0], out=gate).mul_(params[1]).sigmoid_().mul_(params[2])
        return
    torch.where(here, vals, score, out=score)
    v = torch.sub(vals, params[0]).mul_(params[1]).sigmoid_().mul_(params[2])
    torch.where(here, v, gate, out=gate)


def _site_gate_add_kernel(hidden: Tensor, adds: Tensor, pick: Optional[Tensor], column: int, gate: Tensor,
                          scratch: List[Tensor]) -> None:
    n = gate.shape[1]
    h = hidden if hidden.dim() == 2 else hidden.view(-1, adds.shape[1])
    rows = h if h.shape[0] == n else h[:n]
    if pick is None:  # one column adds adds[0] in every row
        rows.addcmul_(gate[column].unsqueeze(1), adds[0])
        return
    # scratch: a (float32 [>= n, hidden]), each column's gathered rows
    a = (scratch[0] if scratch[0].shape[0] == n else scratch[0][:n]) if scratch else None
    for k in range(pick.shape[0]):
        rows.addcmul_(gate[k].unsqueeze(1), torch.index_select(adds, 0, pick[k], out=a) if a is not None
                      else adds.index_select(0, pick[k]))


def _capture_kernel(hidden: Tensor, src: Tensor, dst: Tensor, buf: Tensor, scratch: List[Tensor]) -> None:
    h = hidden.view(-1, buf.shape[1])
    n = min(h.shape[0], src.shape[0])
    if scratch:  # static mode: tmp [T, hidden]
        tmp = scratch[0][:n]
        torch.index_select(h, 0, src[:n], out=tmp)
    else:
        tmp = h.index_select(0, src[:n])
    buf.index_copy_(0, dst[:n], tmp)


@torch.library.custom_op("shmsteer::steer_", mutates_args=("hidden", "scratch"))
def _steer_op(hidden: Tensor, table: Tensor, index: Tensor, rowsel: Optional[Tensor], dirs: Optional[Tensor],
              params: Optional[Tensor], clamps: int, scratch: List[Tensor]) -> None:
    _steer_kernel(hidden, table, index, rowsel, dirs, params, clamps, scratch)


@_steer_op.register_fake
def _steer_fake(hidden: Tensor, table: Tensor, index: Tensor, rowsel: Optional[Tensor], dirs: Optional[Tensor],
                params: Optional[Tensor], clamps: int, scratch: List[Tensor]) -> None:
    return None


@torch.library.custom_op("shmsteer::gate_probe_", mutates_args=("gate", "score", "scratch"))
def _gate_probe_op(hidden: Tensor, probe: Tensor, slots: Tensor, sites: Tensor, site: Tensor, params: Tensor,
                   gate: Tensor, score: Tensor, scratch: List[Tensor]) -> None:
    _gate_probe_kernel(hidden, probe, slots, sites, site, params, gate, score, scratch)


@_gate_probe_op.register_fake
def _gate_probe_fake(hidden: Tensor, probe: Tensor, slots: Tensor, sites: Tensor, site: Tensor, params: Tensor,
                     gate: Tensor, score: Tensor, scratch: List[Tensor]) -> None:
    return None


@torch.library.custom_op("shmsteer::gate_add_", mutates_args=("hidden", "scratch"))
def _gate_add_op(hidden: Tensor, adds: Tensor, slots: Tensor, gate: Tensor, scratch: List[Tensor]) -> None:
    _gate_add_kernel(hidden, adds, slots, gate, scratch)


@_gate_add_op.register_fake
def _gate_add_fake(hidden: Tensor, adds: Tensor, slots: Tensor, gate: Tensor, scratch: List[Tensor]) -> None:
    return None


@torch.library.custom_op("shmsteer::site_gate_probe_", mutates_args=("gate", "score", "scratch"))
def _site_gate_probe_op(hidden: Tensor, probes: Tensor, pick: Tensor, here: Optional[Tensor], params: Tensor,
                        gate: Tensor, score: Tensor, scratch: List[Tensor]) -> None:
    _site_gate_probe_kernel(hidden, probes, pick, here, params, gate, score, scratch)


@_site_gate_probe_op.register_fake
def _site_gate_probe_fake(hidden: Tensor, probes: Tensor, pick: Tensor, here: Optional[Tensor], params: Tensor,
                          gate: Tensor, score: Tensor, scratch: List[Tensor]) -> None:
    return None


@torch.library.custom_op("shmsteer::site_gate_add_", mutates_args=("hidden", "scratch"))
def _site_gate_add_op(hidden: Tensor, adds: Tensor, pick: Optional[Tensor], column: int, gate: Tensor,
                      scratch: List[Tensor]) -> None:
    _site_gate_add_kernel(hidden, adds, pick, column, gate, scratch)


@_site_gate_add_op.register_fake
def _site_gate_add_fake(hidden: Tensor, adds: Tensor, pick: Optional[Tensor], column: int, gate: Tensor,
                        scratch: List[Tensor]) -> None:
    return None


@torch.library.custom_op("shmsteer::capture_", mutates_args=("buf", "scratch"))
def _capture_op(hidden: Tensor, src: Tensor, dst: Tensor, buf: Tensor, scratch: List[Tensor]) -> None:
    _capture_kernel(hidden, src, dst, buf, scratch)


@_capture_op.register_fake
def _capture_fake(hidden: Tensor, src: Tensor, dst: Tensor, buf: Tensor, scratch: List[Tensor]) -> None:
    return None


_NONE: List[Tensor] = []  # no scratch: the kernels allocate their temporaries
_HALF = (torch.bfloat16, torch.float16)


def add_rows_(h: Tensor, rows: Tensor) -> None:
    """``h += rows`` in place, as ``add_``. Compiled, a half dtype adds in float32 and rounds
    once, which is what ``add_`` computes (the same bits), written so that inductor does not
    fold the add with a preceding matmul into an ``addmm``: on a CPU a bf16 ``addmm`` costs more
    than the ``mm`` and the add fused into the next loop (a steered ``mlp_out``, the output of
    a ``Linear``, otherwise cost 2-4% of a small Llama's compiled decode step)."""
    if h.dtype in _HALF and torch.compiler.is_compiling():
        h.copy_(h.float() + rows.float())
    else:
        h.add_(rows)


def _steer_traced(hidden: Tensor, table: Tensor, index: Tensor, dirs: Optional[Tensor], params: Optional[Tensor],
                  clamps: int) -> None:
    """``steer_`` without ``rowsel`` as the aten operations ``torch.compile`` traces (no scratch:
    the compiler plans its own temporaries): the gather and the add, then the clamps in float32.
    Inductor fuses the gather-add with the ops around the site into one loop over the rows, where
    the opaque operator is a call through the dispatcher into Python (about 10 aten calls and
    0.1 ms a site on a CPU) that also keeps the site's neighbours from fusing."""
    h = hidden if hidden.dim() == 2 else hidden.view(-1, table.shape[1])
    m, n = index.shape[0], h.shape[0]
    idx, dst = (index, h) if m == n else ((index, h[:m]) if m < n else (index[:n], h))
    add_rows_(dst, table[idx])
    if clamps <= 0 or dirs is None or params is None:
        return
    x = dst.float()
    d, p = dirs[idx], params[idx]
    for j in range(clamps):  # as apply_clamps: p = h.u; h += strength * (clip(p, lo, hi) - p) * u
        u = d[:, j]
        dot = (x * u).sum(1)
        c = torch.minimum(torch.maximum(dot, p[:, j, 0]), p[:, j, 1])
        x = x + ((c - dot) * p[:, j, 2]).unsqueeze(1) * u
    dst.copy_(x)


def steer_(hidden: Tensor, table: Tensor, index: Tensor, rowsel: Optional[Tensor] = None,
           dirs: Optional[Tensor] = None, params: Optional[Tensor] = None, clamps: int = 0,
           scratch: List[Tensor] = _NONE) -> None:
    """``torch.ops.shmsteer.steer_`` (its kernel directly when not compiling). Compiled without
    ``rowsel`` (static mode's form) it traces the same arithmetic as aten operations
    (:func:`_steer_traced`), which the compiler fuses into the graph around the site."""
    if not torch.compiler.is_compiling():
        _steer_kernel(hidden, table, index, rowsel, dirs, params, clamps, scratch)
    elif rowsel is None:
        _steer_traced(hidden, table, index, dirs, params, clamps)
    else:
        torch.ops.shmsteer.steer_(hidden, table, index, rowsel, dirs, params, clamps, scratch)


def gate_probe_(hidden: Tensor, probe: Tensor, slots: Tensor, sites: Tensor, site: Tensor, params: Tensor,
                gate: Tensor, score: Tensor, scratch: List[Tensor] = _NONE) -> None:
    """``torch.ops.shmsteer.gate_probe_`` (its kernel directly when not compiling)."""
    if torch.compiler.is_compiling():
        torch.ops.shmsteer.gate_probe_(hidden, probe, slots, sites, site, params, gate, score, scratch)
    else:
        _gate_probe_kernel(hidden, probe, slots, sites, site, params, gate, score, scratch)


def gate_add_(hidden: Tensor, adds: Tensor, slots: Tensor, gate: Tensor, scratch: List[Tensor] = _NONE) -> None:
    """``torch.ops.shmsteer.gate_add_`` (its kernel directly when not compiling)."""
    if torch.compiler.is_compiling():
        torch.ops.shmsteer.gate_add_(hidden, adds, slots, gate, scratch)
    else:
        _gate_add_kernel(hidden, adds, slots, gate, scratch)


def site_gate_probe_(hidden: Tensor, probes: Tensor, pick: Tensor, here: Optional[Tensor], params: Tensor,
                     gate: Tensor, score: Tensor, scratch: List[Tensor] = _NONE) -> None:
    """``torch.ops.shmsteer.site_gate_probe_`` (its kernel directly when not compiling)."""
    if torch.compiler.is_compiling():
        torch.ops.shmsteer.site_gate_probe_(hidden, probes, pick, here, params, gate, score, scratch)
    else:
        _site_gate_probe_kernel(hidden, probes, pick, here, params, gate, score, scratch)


def site_gate_add_(hidden: Tensor, adds: Tensor, pick: Optional[Tensor], column: int, gate: Tensor,
                   scratch: List[Tensor] = _NONE) -> None:
    """``torch.ops.shmsteer.site_gate_add_`` (its kernel directly when not compiling)."""
    if torch.compiler.is_compiling():
        torch.ops.shmsteer.site_gate_add_(hidden, adds, pick, column, gate, scratch)
    else:
        _site_gate_add_kernel(hidden, adds, pick, column, gate, scratch)


def capture_(hidden: Tensor, src: Tensor, dst: Tensor, buf: Tensor, scratch: List[Tensor] = _NONE) -> None:
    """``torch.ops.shmsteer.capture_`` (its kernel directly when not compiling)."""
    if torch.compiler.is_compiling():
        torch.ops.shmsteer.capture_(hidden, src, dst, buf, scratch)
    else:
        _capture_kernel(hidden, src, dst, buf, scratch)


__all__ = ["steer_", "gate_probe_", "gate_add_", "site_gate_probe_", "site_gate_add_", "capture_"]
