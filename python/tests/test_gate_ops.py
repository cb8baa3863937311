"""The per-site gate operators (``site_gate_probe_``, ``site_gate_add_``) against the per-column
ones (``gate_probe_``, ``gate_add_``) and a per-request loop: the same score bits (so the same
decisions), the same outputs; opcheck of both; the device path builds its per-site tables once
for a steady gated batch."""

from __future__ import annotations

from typing import Tuple

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="torch not importable")

import shmsteer  # noqa: E402
from shmsteer import ops  # noqa: E402
from shmsteer.torch_hook import SteeringHooks  # noqa: E402

SITE, OTHER = 5, 9


def _case(n: int, hidden: int, dtype: torch.dtype, seed: int) -> Tuple[torch.Tensor, ...]:
    """Rows, a gate-slot probe table (slots 1 and 3 equal, slot 4 probing elsewhere), two
    columns of slots, their probe sites, params."""
    g = torch.Generator().manual_seed(seed)
    h = (torch.randn(n, hidden, generator=g) * 3).to(dtype)
    probe = torch.randn(6, hidden, generator=g)
    probe[0] = 0
    probe[3] = probe[1]
    site_of = torch.tensor([-1, SITE, SITE, SITE, OTHER, SITE])
    slots = torch.randint(0, 6, (2, n), generator=g)
    slots[1, : n // 2] = 0  # a column without a gate in half the rows
    sites = site_of[slots]
    params = torch.rand(3, 2, n, generator=g)
    params[0] -= 0.5
    params[1] *= 20
    return h, probe, slots, sites, params


def _compact(probe: torch.Tensor, slots: torch.Tensor, sites: torch.Tensor) -> Tuple[torch.Tensor, ...]:
    """What EagerGates builds for SITE: the distinct probe rows by content, pick and here."""
    here = sites == SITE
    used = sorted(set(slots[here].tolist()))
    rows, lut = [], {}
    for s in used:
        for u, r in enumerate(rows):
            if torch.equal(probe[s], r):
                lut[s] = u
                break
        else:
            lut[s] = len(rows)
            rows.append(probe[s])
    pick = torch.tensor([[lut.get(s, 0) for s in col] for col in slots.tolist()])
    return torch.stack(rows), pick, here


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("n,hidden", [(1, 8), (7, 1000), (64, 4096)])
def test_site_gate_probe_same_bits_as_per_column(dtype, n, hidden):
    h, probe, slots, sites, params = _case(n, hidden, dtype, seed=n + hidden)
    probes, pick, here = _compact(probe, slots, sites)
    assert probes.shape[0] < len(set(slots[here].tolist())) or n == 1  # slots 1 and 3 share a row
    want_g, want_s = torch.full((2, n), 7.0), torch.full((2, n), 7.0)
    ops._gate_probe_kernel(h, probe, slots, sites, torch.tensor(SITE), params, want_g, want_s, [])
    for scratch in ([], [torch.empty(n + 3, hidden)]):
        got_g, got_s = torch.full((2, n), 7.0), torch.full((2, n), 7.0)
        ops.site_gate_probe_(h, probes, pick, here, params, got_g, got_s, scratch)
        assert torch.equal(got_s, want_s)
        assert torch.equal(got_g, want_g)
    # Per request: each probed row's own dot, the same bits; the others untouched.
    hf = h.float()
    for k in range(2):
        for t in range(n):
            if here[k, t]:
                assert torch.equal(got_s[k, t], (hf[t] * probe[slots[k, t]]).sum()), (k, t)
            else:
                assert got_s[k, t] == 7.0 and got_g[k, t] == 7.0
    assert bool(here.any())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("n,hidden", [(1, 8), (7, 1000), (64, 4096)])
@pytest.mark.parametrize("both_add", [False, True])
def test_site_gate_add_same_as_per_column(dtype, n, hidden, both_add):
    """One adding column a row: the same bits. Two: the same bits too (both add column by
    column)."""
    g = torch.Generator().manual_seed(n)
    h = torch.randn(n, hidden, generator=g).to(dtype)
    adds = torch.randn(6, hidden, generator=g).to(dtype)
    adds[0] = adds[2] = 0  # slot 2 adds nothing at this site
    slots = torch.randint(0, 6, (2, n), generator=g)
    if both_add:
        slots[1] = torch.where(slots[1] == slots[0], 0, slots[1])
    else:
        slots[1] = torch.where(torch.rand(n, generator=g) < 0.5, 0, 2)  # gated, adding nothing here
    gate = torch.rand(2, n, generator=g)
    used = sorted(s for s in set(slots.view(-1).tolist()) if adds[s].any())
    lut = {s: i for i, s in enumerate(used)}
    pick = torch.tensor([[lut.get(s, len(used)) for s in col] for col in slots.tolist()])
    table = torch.cat((adds[used].float(), torch.zeros(1, hidden)))  # the site's rows, then zeros
    want = h.clone()
    ops._gate_add_kernel(want, adds, slots, gate, [])
    for scratch in ([], [torch.empty(n, hidden)]):
        got = h.clone()
        ops.site_gate_add_(got, table, pick, -1, gate, scratch)
        assert torch.equal(got, want)
    assert not torch.equal(want, h) or not used


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_site_gate_fast_forms_same_bits(dtype):
    """Every column probing here (here None) and one column adding one row everywhere (pick
    None): the same bits as the per-column ops."""
    n, hidden = 33, 4096
    h, probe, slots, _, params = _case(n, hidden, dtype, seed=9)
    slots = torch.stack((torch.full((n,), 1), torch.full((n,), 3)))  # equal probes: one table row
    sites = torch.full((2, n), SITE)
    want_g, want_s = torch.zeros(2, n), torch.zeros(2, n)
    ops._gate_probe_kernel(h, probe, slots, sites, torch.tensor(SITE), params, want_g, want_s, [])
    got_g, got_s = torch.zeros(2, n), torch.zeros(2, n)
    ops.site_gate_probe_(h, probe[1:2], torch.zeros(2, n, dtype=torch.long), None, params, got_g, got_s,
                         [torch.empty(n, hidden)])
    assert torch.equal(got_s, want_s) and torch.equal(got_g, want_g)
    adds = torch.zeros(3, hidden, dtype=dtype)
    adds[2] = torch.randn(hidden).to(dtype)
    aslots = torch.stack((torch.zeros(n, dtype=torch.long), torch.full((n,), 2)))  # column 1 adds row 2
    want, got = h.clone(), h.clone()
    ops._gate_add_kernel(want, adds, aslots, want_g, [])
    ops.site_gate_add_(got, torch.cat((adds[2:3].float(), torch.zeros(1, hidden))), None, 1, got_g, [])
    assert torch.equal(got, want) and not torch.equal(got, h)


def test_site_gate_ops_pass_opcheck():
    h, probe, slots, sites, params = _case(5, 8, torch.float32, seed=1)
    probes, pick, here = _compact(probe, slots, sites)
    gate, score = torch.zeros(2, 5), torch.zeros(2, 5)
    adds = torch.cat((torch.randn(2, 8), torch.zeros(1, 8)))  # two rows, then zeros
    apick = torch.tensor([[0, 1, 2, 0, 1], [2, 2, 0, 1, 2]])
    cases = [
        (torch.ops.shmsteer.site_gate_probe_.default, (h, probes, pick, here, params, gate, score, [])),
        (torch.ops.shmsteer.site_gate_probe_.default, (h, probes, pick, here, params, gate, score, [torch.zeros(5, 8)])),
        (torch.ops.shmsteer.site_gate_add_.default, (h.clone(), adds, apick, -1, gate.uniform_(), [])),
        (torch.ops.shmsteer.site_gate_add_.default, (h.clone(), adds, None, 1, gate, [])),
        (torch.ops.shmsteer.site_gate_probe_.default, (h, probes, pick, None, params, gate, score, [])),
        (torch.ops.shmsteer.site_gate_add_.default, (h.clone().bfloat16(), adds, apick, -1, gate, [torch.zeros(5, 8)])),
    ]
    for op, args in cases:
        torch.library.opcheck(op, args)
    x = h.clone()
    torch.ops.shmsteer.site_gate_add_(x, adds, apick, -1, gate, [])
    want = h.clone()
    ops._gate_add_kernel(want, adds, apick, gate, [])
    torch.testing.assert_close(x, want, rtol=0, atol=0)


def test_steady_gated_batch_builds_its_site_tables_once(ns, secret):
    d = 16
    with shmsteer.Owner(ns, secret=secret, hidden=d, layers=3) as o:
        o.register_vector("p", [("post_block", 0, 1.0, np.eye(d, dtype=np.float32)[0])], kind="probe")
        o.register_vector("s", [("post_block", 1, 1.0, np.eye(d, dtype=np.float32)[1])])
        probe = {"kind": "probe", "probe": {"kind": "name", "name": "p"}, "threshold": 0, "sharpness": 1}
        gates = [{"when": probe, "scope": "this_token", "apply": {"kind": "add", "steer": {"kind": "name", "name": "s"}, "strength": 1}},
                 {"when": probe, "scope": "next_step", "apply": {"kind": "attenuate", "strength": 0.5}}]
        for r in range(4):
            o.admit(f"r{r}", steering=gates)
        hooks = SteeringHooks(o, force_device_path=True)
        blocks = torch.nn.ModuleList(torch.nn.Identity() for _ in range(3))
        for layer, b in enumerate(blocks):
            hooks.attach(b, "post_block", layer)
        spans = [(f"r{r}", r, r + 1, "decode") for r in range(4)]
        x = torch.zeros(4, d)
        x[:, 0] = torch.tensor([1.0, -1.0, 2.0, -2.0])
        outs = []
        for _ in range(4):
            y = x.clone()
            with torch.no_grad(), hooks.step(spans):
                for b in blocks:
                    y = b(y)
            outs.append(y)
        gates_ = hooks._gates  # type: ignore[attr-defined]
        # Step 1 builds; step 2 sees the attenuation decided by step 1 (new factors) and
        # rebuilds; from then on the batch is steady.
        assert gates_.builds == 2, gates_.builds
        assert torch.equal(outs[2], outs[3])
        assert bool((outs[3][:, 1] != 0).all())  # every row's gated add landed
        assert hooks.stepper.stats()["gate_fires"] > 0
