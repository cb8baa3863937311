"""A steering scenario and its float64 reference, shared by the device-path tests (CPU and CUDA).

The model is a chain of identity modules, one per hook point, so the hooked outputs are exactly
what the steering made of the input: ``reference`` computes the same chain in float64 from the
definitions registered (composed vectors, then the clamps in the engine's order: global base,
global phase, request base, request phase)."""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np
import torch

HIDDEN, LAYERS = 64, 4
HOOKS = ("pre_attn", "post_block")


class Chain(torch.nn.Module):
    """Identity modules in hook order: pre_attn of layer 0, post_block of layer 0, ..."""

    def __init__(self) -> None:
        super().__init__()
        self.points = torch.nn.ModuleList(torch.nn.Identity() for _ in range(LAYERS * len(HOOKS)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for m in self.points:
            x = m(x)
        return x

    def sites(self) -> List[Tuple[torch.nn.Module, str, int]]:
        return [(self.points[l * len(HOOKS) + i], h, l) for l in range(LAYERS) for i, h in enumerate(HOOKS)]


def attach(hooks: Any, chain: Chain) -> None:
    for mod, hook, layer in chain.sites():
        hooks.attach(mod, hook, layer)


def unit(rng: np.random.Generator) -> np.ndarray:
    v = rng.standard_normal(HIDDEN)
    return v / np.linalg.norm(v)


class Scenario:
    """Named vectors, global tiers and requests, written through an Owner, remembered for the
    reference."""

    def __init__(self, owner: Any, seed: int = 1, clamps: bool = True) -> None:
        self.o = owner
        self.rng = np.random.default_rng(seed)
        self.named: Dict[str, List[Tuple[str, int, float, np.ndarray]]] = {}
        self.global_: Dict[str, Any] = {}
        self.reqs: Dict[str, Dict[str, Any]] = {}
        rng = self.rng
        for i in range(3):
            self.register(f"n{i}", [(h, l, float(rng.uniform(0.5, 1.5)), rng.standard_normal(HIDDEN).astype(np.float32))
                                    for h in HOOKS for l in range(LAYERS) if rng.random() < 0.6])
        g: Dict[str, Any] = {
            "base": {"vectors": [self.vec("post_block", 1, 0.5)]},
            "decode": {"refs": [{"name": "n0", "strength": 0.25}]},
        }
        if clamps:
            g["prefill"] = {"clamps": [self.clamp("pre_attn", 2, -0.5, 0.5, 1.0)]}
        self.set_global(g)
        self.admit("a", {"base": {"refs": [{"name": "n1", "strength": 2.0}]}})
        self.admit("b", {"decode": {"vectors": [self.vec("pre_attn", 0, 1.0), self.vec("post_block", 3, -0.5)]},
                         **({"base": {"clamps": [self.clamp("post_block", 1, 0.0, 0.0, 1.0),
                                                 self.clamp("post_block", 1, -0.2, 0.3, 0.5)]}} if clamps else {})})
        self.admit("c", {"prefill": {"refs": [{"name": "n2", "strength": -1.0}],
                                     **({"clamps": [self.clamp("pre_attn", 2, -1.0, 1.0, 0.75)]} if clamps else {})}})
        self.admit("d", None)  # no steering of its own: the global slot

    # ---- writers that remember ----

    def vec(self, hook: str, layer: int, scale: float) -> Dict[str, Any]:
        return {"hook": hook, "layer": layer, "scale": scale,
                "data": self.rng.standard_normal(HIDDEN).astype(np.float32).tolist()}

    def clamp(self, hook: str, layer: int, lo: float, hi: float, strength: float) -> Dict[str, Any]:
        return {"hook": hook, "layer": layer, "dir": (unit(self.rng) * 3).tolist(), "min": lo, "max": hi,
                "strength": strength}

    def register(self, name: str, entries: Sequence[Tuple[str, int, float, np.ndarray]]) -> None:
        self.o.register_vector(name, list(entries))
        self.named[name] = list(entries)

    def set_global(self, g: Dict[str, Any]) -> None:
        self.o.set_global(g)
        self.global_ = g

    def admit(self, rid: str, override: Optional[Dict[str, Any]]) -> None:
        self.o.admit(rid, override=override)
        self.reqs[rid] = override or {}

    def end(self, rid: str) -> None:
        self.o.end(rid)
        self.reqs.pop(rid, None)

    # ---- the float64 reference ----

    def effective(self, rid: str, phase: str, hook: str, layer: int) -> Tuple[np.ndarray, List[Tuple[np.ndarray, float, float, float]]]:
        eff = np.zeros(HIDDEN)
        clamps = []
        for s in (self.global_, self.reqs.get(rid, {})):
            for tier in ("base", phase):
                t = s.get(tier) or {}
                for v in t.get("vectors", []):
                    if v["hook"] == hook and v["layer"] == layer:
                        eff += v["scale"] * np.asarray(v["data"], np.float64)
                for r in t.get("refs", []):
                    for h, l, sc, data in self.named.get(r["name"], []):
                        if h == hook and l == layer:
                            eff += r["strength"] * sc * data.astype(np.float64)
        for s in (self.global_, self.reqs.get(rid, {})):
            for tier in ("base", phase):
                for c in (s.get(tier) or {}).get("clamps", []):
                    if c["hook"] == hook and c["layer"] == layer:
                        d = np.asarray(c["dir"], np.float64)
                        clamps.append((d / np.linalg.norm(d), c["min"], c["max"], c["strength"]))
        return eff, clamps

    def reference(self, x: torch.Tensor, spans: Sequence[Tuple[str, int, int, str]]) -> np.ndarray:
        """The chain's output in float64 for input x (any dtype, read as float64)."""
        h = x.detach().cpu().double().numpy().reshape(-1, HIDDEN).copy()
        for layer in range(LAYERS):
            for hook in HOOKS:
                for rid, a, b, phase in spans:
                    eff, clamps = self.effective(rid, phase, hook, layer)
                    rows = h[a:b]
                    rows += eff
                    for u, lo, hi, st in clamps:
                        p = rows @ u
                        rows += (st * (np.clip(p, lo, hi) - p))[:, None] * u[None, :]
        return h


#: Unit roundoff of each reduced-precision dtype; float32 paths compute in float32 throughout.
UNIT = {torch.bfloat16: 2.0 ** -8, torch.float16: 2.0 ** -11}
F32_TOL = 2e-5


def tolerance(dtype: torch.dtype, roundings_per_site: int = 1) -> float:
    """The bound on the worst relative error after the chain's sites, each rounding its output
    to ``dtype`` ``roundings_per_site`` times: once on the native path (it steers in float32 and
    converts back), twice on the device path (the table row is stored in ``dtype``, and the
    gather-add's sum is rounded again; its clamps run in float32)."""
    if dtype == torch.float32:
        return F32_TOL
    return LAYERS * len(HOOKS) * roundings_per_site * UNIT[dtype]


def assert_close_to_reference(got: torch.Tensor, want: np.ndarray, dtype: torch.dtype, what: str,
                              roundings_per_site: int = 1) -> None:
    g = got.detach().cpu().double().numpy().reshape(want.shape)
    scale = 1.0 + np.abs(want)
    err = np.abs(g - want) / scale
    worst = float(err.max()) if err.size else 0.0
    tol = tolerance(dtype, roundings_per_site)
    assert worst <= tol, f"{what}: worst relative error {worst:.3g} above {tol:.3g} for {dtype}"
