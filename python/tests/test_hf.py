"""shmsteer.hf on small random-weight Hugging Face models (built from their configs, saved and
loaded back as safetensors: nothing is downloaded): steered greedy generate() against plain torch
hooks written here that add the same composed vectors at the same points, unsteered rows against
an unsteered run, left padding with prompts of different lengths, prefill-only and decode-only
steering, capture of a request's rows against the model's own hidden states, a probe gate."""

from __future__ import annotations

import contextlib
import io
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="torch not importable")
transformers = pytest.importorskip("transformers", reason="transformers not importable (python/requirements-ci.txt)")

import shmsteer  # noqa: E402
from shmsteer import capture  # noqa: E402
from shmsteer.capture import Begin, Consumer, End, Record  # noqa: E402
from shmsteer.hf import HOOK_POINTS, HFSteering, RequestBatchError, UnsupportedModelError  # noqa: E402
from shmsteer.torch_hook import SteeringHooks  # noqa: E402

HIDDEN, LAYERS, VOCAB, NEW = 64, 2, 100, 4
ARCHS = ["llama", "qwen2", "qwen3", "mistral", "gemma", "gemma2", "gemma3_text", "gpt2"]
Site = Tuple[str, int]


def config(arch: str) -> Any:
    t = transformers
    common = dict(vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=128, num_hidden_layers=LAYERS,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64, initializer_range=0.2,
                  pad_token_id=0, bos_token_id=1, eos_token_id=VOCAB - 1)
    if arch == "gpt2":
        return t.GPT2Config(vocab_size=VOCAB, n_embd=HIDDEN, n_layer=LAYERS, n_head=4, n_positions=64,
                            initializer_range=0.2, pad_token_id=0, bos_token_id=1, eos_token_id=VOCAB - 1)
    cls = {"llama": t.LlamaConfig, "qwen2": t.Qwen2Config, "qwen3": t.Qwen3Config, "mistral": t.MistralConfig,
           "gemma": t.GemmaConfig, "gemma2": t.Gemma2Config, "gemma3_text": t.Gemma3TextConfig}[arch]
    if arch != "llama" and arch != "qwen2":
        common["head_dim"] = HIDDEN // 4
    return cls(**common)


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """arch -> the model, built once per module from its config with seeded random weights,
    saved as safetensors and loaded back."""
    cache: Dict[str, Any] = {}

    def get(arch: str) -> Any:
        if arch not in cache:
            torch.manual_seed(0)
            m = transformers.AutoModelForCausalLM.from_config(config(arch))
            d = tmp_path_factory.mktemp(arch)
            m.save_pretrained(d)
            assert (d / "model.safetensors").exists()
            cache[arch] = transformers.AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32).eval()
        return cache[arch]

    return get


# Prompts of 5, 3 and 4 tokens, left padded (pad id 0).
IDS = torch.tensor([[5, 6, 7, 8, 9], [0, 0, 10, 11, 12], [0, 13, 14, 15, 16]])
MASK = (IDS != 0).long()


def gen(model: Any, run: Any = None, ids: torch.Tensor = IDS, mask: torch.Tensor = MASK) -> Tuple[torch.Tensor, torch.Tensor]:
    """Greedy generate: (sequences, logits [steps, batch, vocab]); run wraps model.generate."""
    call = run or model.generate
    out = call(input_ids=ids, attention_mask=mask, max_new_tokens=NEW, do_sample=False, return_dict_in_generate=True,
               output_logits=True)
    return out.sequences, torch.stack(out.logits)


# ---- the plain torch reference ----------------------------------------------------------------

# arch -> (the layer list from the causal LM, the norm before the MLP, the MLP branch's last module)
PRE_NORM = ("model.layers", "post_attention_layernorm", "mlp")
SANDWICH = ("model.layers", "pre_feedforward_layernorm", "post_feedforward_layernorm")
MODULES = {"gpt2": ("transformer.h", "ln_2", "mlp"), "gemma2": SANDWICH, "gemma3_text": SANDWICH}


def layers_of(model: Any, arch: str) -> List[Any]:
    obj = model
    for p in MODULES.get(arch, PRE_NORM)[0].split("."):
        obj = getattr(obj, p)
    return list(obj)


def mlp_norm(layer: Any, arch: str) -> Any:
    return getattr(layer, MODULES.get(arch, PRE_NORM)[1])


def mlp_out(layer: Any, arch: str) -> Any:
    return getattr(layer, MODULES.get(arch, PRE_NORM)[2])


class Reference:
    """Plain torch hooks adding, per batch row, vectors(row, phase, site) to that row's real
    (unpadded) tokens: a forward of more than one token a row is the prefill, of one a decode
    step. pre_attn: in place on the layer's input; post_attn: on the MLP norm's input; mlp_in:
    its output; mlp_out: the MLP's output; post_block: the layer's output. ``gate`` (optional):
    (probe site, probe, threshold, sharpness, add site, add vector) of a this_token probe gate on
    the rows it names, decode rows only."""

    def __init__(self, model: Any, arch: str, vectors: Any, gate: Optional[Tuple[Any, ...]] = None,
                 gated_rows: Tuple[int, ...] = ()) -> None:
        self.vectors, self.gate, self.gated_rows = vectors, gate, gated_rows
        self.mask: Optional[torch.Tensor] = None
        self.seq = 0
        self.gates: List[torch.Tensor] = []
        self.g: Optional[torch.Tensor] = None  # this decode step's gates
        self.handles = [model.register_forward_pre_hook(self._top, with_kwargs=True)]
        for i, layer in enumerate(layers_of(model, arch)):
            norm = mlp_norm(layer, arch)
            self.handles += [
                layer.register_forward_pre_hook(self._pre(("pre_attn", i)), with_kwargs=True),
                norm.register_forward_pre_hook(self._pre(("post_attn", i)), with_kwargs=True),
                norm.register_forward_hook(self._out(("mlp_in", i))),
                mlp_out(layer, arch).register_forward_hook(self._out(("mlp_out", i))),
                layer.register_forward_hook(self._out(("post_block", i))),
            ]

    def _top(self, _m: Any, _a: Any, kwargs: Dict[str, Any]) -> None:
        self.mask, self.seq = kwargs["attention_mask"], kwargs["input_ids"].shape[1]
        self.g = None

    def _pre(self, site: Site) -> Any:
        def fn(_m: Any, args: Any, kwargs: Dict[str, Any]) -> None:
            self.add(site, args[0] if args else kwargs["hidden_states"])
        return fn

    def _out(self, site: Site) -> Any:
        def fn(_m: Any, _a: Any, out: Any) -> None:
            self.add(site, out[0] if isinstance(out, tuple) else out)
        return fn

    def add(self, site: Site, t: torch.Tensor) -> None:
        assert self.mask is not None
        h = t.view(self.mask.shape[0], self.seq, HIDDEN)
        phase = "prefill" if self.seq > 1 else "decode"
        for i in range(h.shape[0]):
            real = self.mask[i, -self.seq:].bool()
            v = self.vectors(i, phase, site)
            if v is not None:
                h[i, real] += torch.from_numpy(v).to(h.device, h.dtype)
        if self.gate is None or phase != "decode":
            return
        probe_site, probe, thr, sharp, add_site, add = self.gate
        rows = list(self.gated_rows)
        if site == probe_site:
            score = h[rows, 0].float() @ torch.from_numpy(probe)
            self.g = torch.sigmoid(sharp * (score - thr))
            self.gates.append(self.g)
        if site == add_site:
            h[rows, 0] += (self.g.unsqueeze(1) * torch.from_numpy(add)).to(h.dtype)

    def close(self) -> None:
        for h in self.handles:
            h.remove()


@contextlib.contextmanager
def reference(model: Any, arch: str, vectors: Any, **kw: Any):
    ref = Reference(model, arch, vectors, **kw)
    try:
        yield ref
    finally:
        ref.close()


# ---- steering as the engine takes it and as the reference composes it ---------------------------

def rand(seed: int) -> np.ndarray:
    return (np.random.default_rng(seed).standard_normal(HIDDEN) * 0.5).astype(np.float32)


# Global steering and two requests' own, by tier; row 2 belongs to no request.
GLOBAL = {"base": {("post_block", 1): rand(1)}, "decode": {("mlp_in", 1): rand(2)}}
STEER = {
    "a": {"base": {("pre_attn", 0): rand(3), ("mlp_out", 1): rand(4)}, "prefill": {("mlp_in", 0): rand(5)},
          "decode": {("post_attn", 1): rand(6)}},
    "b": {"prefill": {("post_block", 0): rand(7)}, "decode": {("pre_attn", 1): rand(8), ("post_attn", 0): rand(9)}},
}
ROWS: List[Optional[str]] = ["a", "b", None]


def override(tiers: Dict[str, Dict[Site, np.ndarray]]) -> Dict[str, Any]:
    return {tier: {"vectors": [{"hook": h, "layer": layer, "scale": 1.0, "data": v.tolist()}
                               for (h, layer), v in sites.items()]} for tier, sites in tiers.items()}


def composed(glob: Dict[str, Dict[Site, np.ndarray]], steer: Dict[str, Dict[str, Dict[Site, np.ndarray]]],
             rows: List[Optional[str]]) -> Any:
    """vectors(row, phase, site): global base + global phase + request base + request phase."""
    def fn(i: int, phase: str, site: Site) -> Optional[np.ndarray]:
        rid = rows[i]
        if rid is None:
            return None
        parts = [t.get(site) for t in (glob.get("base", {}), glob.get(phase, {}), steer.get(rid, {}).get("base", {}),
                                       steer.get(rid, {}).get(phase, {}))]
        parts = [p for p in parts if p is not None]
        return np.sum(parts, axis=0, dtype=np.float32) if parts else None
    return fn


@contextlib.contextmanager
def owner(ns: str, secret: bytes, glob: Any = None, steer: Any = None, **admit: Any):
    with shmsteer.Owner(ns, secret=secret, hidden=HIDDEN, layers=LAYERS) as o:
        if glob:
            o.set_global(override(glob))
        for rid, tiers in (steer or {}).items():
            o.admit(rid, override=override(tiers), **admit.get(rid, {}))
        yield o


def check(got: Tuple[torch.Tensor, torch.Tensor], want: Tuple[torch.Tensor, torch.Tensor]) -> None:
    assert torch.equal(got[0], want[0]), (got[0], want[0])
    torch.testing.assert_close(got[1], want[1], rtol=1e-4, atol=1e-4)


# ---- the tests -----------------------------------------------------------------------------------

@pytest.mark.parametrize("arch", ARCHS)
def test_generate_matches_plain_torch_hooks(models, ns, secret, arch):
    """Every hook point and phase tier, global and per request, three prompts of different
    lengths left padded, a row no request owns: the same tokens and logits as the plain hooks;
    the unowned row bit for bit as an unsteered run, the steered rows not."""
    m = models(arch)
    plain = gen(m)
    with reference(m, arch, composed(GLOBAL, STEER, ROWS)):
        want = gen(m)
    with owner(ns, secret, GLOBAL, STEER) as o, HFSteering(m, o) as st:
        assert st.points == HOOK_POINTS
        got = gen(m, lambda **kw: st.generate(ROWS, **kw))
    check(got, want)
    assert torch.equal(got[0][2], plain[0][2]) and torch.equal(got[1][:, 2], plain[1][:, 2])
    for row in (0, 1):
        assert not torch.allclose(got[1][:, row], plain[1][:, row]), f"row {row} is steered"
    assert torch.equal(gen(m)[1], plain[1]), "closed: the hooks are gone"


@pytest.mark.parametrize("mode", ["device", "static"])
def test_device_and_static_paths_generate_as_plain_torch_hooks(models, ns, secret, mode):
    """The device path (tables and one gather-add per site) and static mode (prepared before
    each forward, reported after it), here on CPU tensors, steer generate as the plain hooks
    do; requests() around model.generate is the same as st.generate."""
    m = models("llama")
    with reference(m, "llama", composed(GLOBAL, STEER, ROWS)):
        want = gen(m)
    with owner(ns, secret, GLOBAL, STEER) as o:
        if mode == "static":
            hooks = SteeringHooks(o, static=True, max_tokens=IDS.numel(), device="cpu", dtype=torch.float32)
        else:
            hooks = SteeringHooks(o, force_device_path=True)
        with HFSteering(m, o, hooks=hooks) as st, st.requests(ROWS):
            got = gen(m)
    check(got, want)


@pytest.mark.parametrize("tier", ["prefill", "decode"])
def test_prefill_only_and_decode_only_steering(models, ns, secret, tier):
    """A request steered in one phase only: a decode-only vector leaves the prefill (the first
    token's logits) untouched, a prefill-only one changes it; both match the plain hooks."""
    m = models("qwen2")
    steer = {"a": {tier: {("post_block", 0): rand(11), ("mlp_out", 1): rand(12)}}}
    rows: List[Optional[str]] = ["a", None, None]
    plain = gen(m)
    with reference(m, "qwen2", composed({}, steer, rows)):
        want = gen(m)
    with owner(ns, secret, None, steer) as o, HFSteering(m, o) as st:
        got = gen(m, lambda **kw: st.generate(rows, **kw))
    check(got, want)
    first_same = torch.equal(got[1][0, 0], plain[1][0, 0])
    assert first_same == (tier == "decode")
    assert not torch.allclose(got[1][1:, 0], plain[1][1:, 0]), "later steps differ either way"


@pytest.mark.parametrize("device_path", [False, True], ids=["native", "device"])
def test_probe_gate_steers_where_it_fires(models, ns, secret, device_path):
    """A this_token probe gate (probe at post_block 0, its add at post_block 1) on one request:
    its decode rows get sigmoid(sharpness * (h.probe - threshold)) x the add, as the plain hooks
    compute it; its prefill rows are never gated; the other rows are untouched."""
    m = models("llama")
    probe = rand(21) / np.linalg.norm(rand(21))
    calm = rand(22)
    thr, sharp, strength = -2.0, 2.0, 2.0
    rows: List[Optional[str]] = ["g", None, None]
    gate = (("post_block", 0), probe.astype(np.float32), thr, sharp, ("post_block", 1), (strength * calm).astype(np.float32))
    plain = gen(m)
    with reference(m, "llama", composed({}, {}, rows), gate=gate, gated_rows=(0,)) as ref:
        want = gen(m)
    gates = torch.cat(ref.gates)
    assert len(ref.gates) == NEW - 1 and 0.01 < float(gates.min()) and float(gates.max()) < 0.99, gates  # a gate, not a switch
    with shmsteer.Owner(ns, secret=secret, hidden=HIDDEN, layers=LAYERS) as o:
        o.register_vector("p", [("post_block", 0, 1.0, probe.astype(np.float32))], kind="probe")
        o.register_vector("calm", [("post_block", 1, 1.0, calm)])
        o.admit("g", steering=[{
            "when": {"kind": "probe", "probe": {"kind": "name", "name": "p"}, "threshold": thr, "sharpness": sharp},
            "scope": "this_token", "apply": {"kind": "add", "steer": {"kind": "name", "name": "calm"}, "strength": strength}}])
        with HFSteering(m, o, points=["post_block"], force_device_path=device_path) as st:
            got = gen(m, lambda **kw: st.generate(rows, **kw))
    check(got, want)
    assert torch.equal(got[1][0, 0], plain[1][0, 0]), "the prefill is never gated"
    assert not torch.allclose(got[1][1:, 0], plain[1][1:, 0])
    assert torch.equal(got[1][:, 1:], plain[1][:, 1:])


def records(c: Any, n_requests: int) -> Dict[Tuple[str, str, int], Tuple[List[int], np.ndarray]]:
    """(request, hook, layer) -> (positions, rows) of every record until n_requests ended."""
    got: Dict[Tuple[str, str, int], Tuple[List[int], List[np.ndarray]]] = {}
    ends = 0
    while ends < n_requests:
        ev = c.next(timeout=5.0)
        assert ev is not None, "no capture event within 5 s"
        if isinstance(ev, Record):
            pos, rows = got.setdefault((ev.request_id, ev.hook, ev.layer), ([], []))
            pos.extend(ev.positions.tolist())
            rows.append(ev.data.copy())
        elif isinstance(ev, End):
            assert ev.dropped == 0
            ends += 1
        else:
            assert isinstance(ev, Begin)
    return {k: (p, np.concatenate(r).reshape(-1, HIDDEN)) for k, (p, r) in got.items()}


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_capture_rows_are_the_models_hidden_states(models, ns, secret, arch):
    """Request a captures every position at all five points of layer 0, b its last prompt
    token's post_block 0: the positions are the request's own (padding never captured) and the
    rows are the model's: pre_attn = the embeddings' output, post_block = hidden_states[1],
    mlp_in = norm(post_attn), mlp_out = mlp(mlp_in), post_block = post_attn + mlp_out."""
    m = models(arch)
    lens = HFSteering.prompt_lens(MASK)
    assert lens == [5, 3, 4]
    spec_a = {"request_id": "a", "tag": "t", "hooks": {h: [0] for h in HOOK_POINTS}, "positions": "all"}
    spec_b = {"request_id": "b", "tag": "t", "hooks": {"post_block": [0]}, "positions": "last_prompt"}
    with shmsteer.Owner(ns, secret=secret, hidden=HIDDEN, layers=LAYERS) as o:
        capture.serve_capture(o, {"py": "filesystem"})
        with HFSteering(m, o) as st:
            st.hooks.start_capture()
            with Consumer(ns, "py", secret=secret) as c:
                assert c.next(timeout=0.2) is None  # the ring notice: c reads the hooks' ring from now on
                o.admit("a", capture={"py": spec_a}, prompt_len=lens[1])
                o.admit("b", capture={"py": spec_b}, prompt_len=lens[2])
                seqs, _ = gen(m, lambda **kw: st.generate([None, "a", "b"], **kw))
                o.end("a")
                o.end("b")
                got = records(c, 2)
    assert set(got) == {("a", h, 0) for h in HOOK_POINTS} | {("b", "post_block", 0)}
    full = torch.cat([MASK, torch.ones(len(IDS), NEW, dtype=MASK.dtype)], dim=1)
    with torch.no_grad():
        pos = (full.cumsum(-1) - 1).clamp(min=0)  # as generate numbers left-padded rows
        hs = m(input_ids=seqs, attention_mask=full, position_ids=pos, output_hidden_states=True).hidden_states
    pad_a, pad_b = IDS.shape[1] - lens[1], IDS.shape[1] - lens[2]
    n_a = lens[1] + NEW - 1  # the last generated token is never fed back
    for h in HOOK_POINTS:
        assert got[("a", h, 0)][0] == list(range(n_a)), h
    row = {h: torch.from_numpy(got[("a", h, 0)][1]) for h in HOOK_POINTS}
    layer = layers_of(m, arch)[0]
    tol = dict(rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(row["pre_attn"], hs[0][1, pad_a:pad_a + n_a], **tol)
    torch.testing.assert_close(row["post_block"], hs[1][1, pad_a:pad_a + n_a], **tol)
    with torch.no_grad():
        torch.testing.assert_close(row["mlp_in"], mlp_norm(layer, arch)(row["post_attn"]), **tol)
        torch.testing.assert_close(row["mlp_out"], layer.mlp(row["mlp_in"]), **tol)
    torch.testing.assert_close(row["post_block"], row["post_attn"] + row["mlp_out"], **tol)
    assert not torch.allclose(row["post_attn"], row["pre_attn"])
    assert got[("b", "post_block", 0)][0] == [lens[2] - 1]
    torch.testing.assert_close(torch.from_numpy(got[("b", "post_block", 0)][1][0]), hs[1][2, IDS.shape[1] - 1], **tol)


def test_spans_of_a_forward() -> None:
    """The spans: a row's padding unowned, its positions counted from its first real token,
    the tokens past its prompt decode (a forward crossing the prompt's end splits the row);
    without a mask the positions are counted by the batch itself."""
    from shmsteer.hf import _Requests
    reqs = _Requests(["a", "b", None], prompt_lens=[3, 4, 2])
    mask = torch.tensor([[0, 1, 1, 1], [1, 1, 1, 1], [0, 0, 1, 1]])
    spans, rows = reqs.spans(3, 4, mask)
    assert spans == [("a", 1, 4, "prefill", 0), ("b", 4, 8, "prefill", 0)] and rows.tolist() == [3, 4, 2]
    mask = torch.cat([mask, torch.ones(3, 2, dtype=mask.dtype)], dim=1)
    assert reqs.spans(3, 2, mask)[0] == [("a", 0, 2, "decode", 3), ("b", 2, 4, "decode", 4)]
    chunk = _Requests(["a"], prompt_lens=[5])
    chunk.seen[:] = 3  # a continued prefill: two prompt tokens, then one decode token
    assert chunk.spans(1, 3, None)[0] == [("a", 0, 2, "prefill", 3), ("a", 2, 3, "decode", 5)]
    first = _Requests(["a"], None)
    assert first.spans(1, 3, torch.tensor([[0, 1, 1]]))[0] == [("a", 1, 3, "prefill", 0)]
    assert first.prompt.tolist() == [2], "the first forward's real tokens are the prompt"
    with pytest.raises(RequestBatchError, match="zeros and ones"):
        first.spans(1, 1, torch.tensor([[0, 2, 1]]))


def test_spans_without_a_mask_equal_an_all_ones_mask() -> None:
    """A forward without a mask (the compiled decode's path, on Python ints) gives the spans and
    row counts an all-ones mask gives, through prefill, a forward crossing the prompt's end, and
    decode, with an unowned row."""
    from shmsteer.hf import _Requests
    a, b = _Requests(["x", None, "y"], prompt_lens=[4, 2, 6]), _Requests(["x", None, "y"], prompt_lens=[4, 2, 6])
    total = 0
    for seq in (3, 2, 1, 1, 4, 1):
        total += seq
        got, q = a.spans(3, seq, None)
        want, wq = b.spans(3, seq, torch.ones(3, total, dtype=torch.int64))
        assert got == want and q.tolist() == wq.tolist(), (seq, got, want)
        a.seen += q
        b.seen += wq
    assert any(s[3] == "prefill" for s in got) is False and len(got) == 2


def test_refusals(models, ns, secret):
    """Right padding, a batch that is not one request a row, a model of another width, a model
    of no known layout, a point the engine does not name: typed errors. A forward outside
    requests() steers nothing."""
    m = models("llama")
    with owner(ns, secret, GLOBAL, STEER) as o:
        with HFSteering(m, o) as st:
            with torch.no_grad():
                plain = m(input_ids=IDS, attention_mask=MASK).logits
            right = torch.tensor([[5, 6, 7, 8, 9], [10, 11, 12, 0, 0], [13, 14, 15, 16, 0]])
            with pytest.raises(RequestBatchError, match="padding_side='left'"):
                st.generate(ROWS, input_ids=right, attention_mask=(right != 0).long(), max_new_tokens=1)
            with pytest.raises(RequestBatchError, match="one request a row"):
                st.generate(ROWS, input_ids=IDS, attention_mask=MASK, max_new_tokens=1, num_beams=2, do_sample=False)
            with pytest.raises(RequestBatchError):
                st.generate(["a"], input_ids=IDS, attention_mask=MASK, max_new_tokens=1)
        with torch.no_grad():
            assert torch.equal(m(input_ids=IDS, attention_mask=MASK).logits, plain)
        with pytest.raises(UnsupportedModelError):
            HFSteering(torch.nn.Linear(HIDDEN, HIDDEN), o)
        with pytest.raises(shmsteer.UnknownHookError):
            HFSteering(m, o, points=["lm_head"])
        with pytest.raises(shmsteer.LayerRangeError):
            HFSteering(m, o, layers=[0, LAYERS])
        with torch.no_grad():
            assert torch.equal(m(input_ids=IDS, attention_mask=MASK).logits, plain), "a refusal attaches nothing"
    with shmsteer.Owner(ns + "-w", secret=secret, hidden=HIDDEN * 2, layers=LAYERS) as o2:
        with pytest.raises(shmsteer.HiddenSizeError):
            HFSteering(m, o2)


def test_readme_hugging_face_example() -> None:
    """The README's "Steer a Hugging Face model" block runs as written."""
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    _, section = readme.split("## Steer a Hugging Face model", 1)
    code = section.split("```python\n", 1)[1].split("```", 1)[0]
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(code, "README.md", "exec"), {})
    assert "steered:" in out.getvalue()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device on this machine")
def test_cuda_generate_matches_plain_torch_hooks(models, ns, secret):
    """On the GPU (the device path's tables on CUDA): the same tokens as the plain hooks."""
    m = models("llama").cuda()
    try:
        ids, mask = IDS.cuda(), MASK.cuda()
        with reference(m, "llama", composed(GLOBAL, STEER, ROWS)):
            want = gen(m, ids=ids, mask=mask)
        with owner(ns, secret, GLOBAL, STEER) as o, HFSteering(m, o) as st:
            got = gen(m, lambda **kw: st.generate(ROWS, **kw), ids=ids, mask=mask)
        check(got, want)
    finally:
        m.cpu()


def test_decode_forwards_reuse_their_packing() -> None:
    """A forward without a mask whose steered rows all decode hands the packed layout of the
    first such forward on, its first positions each row's tokens so far (never the last
    step's); a forward with a mask or of another seq gives the spans again and drops it."""
    from shmsteer.device import PackedSpans
    from shmsteer.hf import _Requests
    for ids in (["x", "y", "z"], ["x", None, "y"]):
        fast, ref = _Requests(ids, prompt_lens=[4, 2, 3]), _Requests(ids, prompt_lens=[4, 2, 3])
        total, packs = 0, []
        for seq, masked in ((4, False), (1, False), (1, False), (1, True), (1, False), (2, False), (2, False), (1, False)):
            total += seq
            mask = torch.ones(3, total, dtype=torch.int64) if masked else None
            got, q = fast.forward_spans(3, seq, mask)
            want, wq = ref.spans(3, seq, None)
            if isinstance(got, PackedSpans):
                packs.append(got)
                assert [(int(r["start"]), int(r["end"]), int(r["first_position"])) for r in got.arr] == \
                    [(s[1], s[2], s[4]) for s in want] and all(s[3] == "decode" for s in want)
            else:
                assert got == want
            assert q.tolist() == wq.tolist()
            fast.seen += q
            ref.seen += wq
        # Packed: the decodes of seq 1 (the first reused by the next) and of seq 2, after the mask.
        assert len(packs) == 6 and packs[0] is packs[1] and packs[2] is not packs[3]


def test_decode_packing_refuses_a_position_past_int32() -> None:
    """The reused layout ends before a position would leave int32: packing it again refuses."""
    from shmsteer.errors import InvalidArgumentError
    from shmsteer.hf import _Requests
    r = _Requests(["x"], prompt_lens=[1])
    r.seen[:] = (1 << 31) - 3
    first, _ = r.forward_spans(1, 1, None)
    for _ in range(2):
        r.seen += 1
        got, _ = r.forward_spans(1, 1, None)
        assert got is first and int(got.arr["first_position"][0]) == int(r.seen[0])
    r.seen += 1
    with pytest.raises(InvalidArgumentError, match="first_position"):
        r.forward_spans(1, 1, None)


def _decode_loop(model: Any, o: Any, reuse: bool, change: bool) -> Tuple[torch.Tensor, bool]:
    """A prefill then 4 decode forwards without a mask through static hooks (the compiled
    decode's path), the global vector changed before the third when ``change``; the logits and
    whether the packed layout was reused."""
    from shmsteer.hf import _Requests
    hooks = SteeringHooks(o, static=True, max_tokens=IDS.numel(), device="cpu", dtype=torch.float32)
    steer = HFSteering(model, o, hooks=hooks)
    real = _Requests.forward_spans
    reused = False
    out = []
    try:
        if not reuse:
            _Requests.forward_spans = lambda self, b, s, m: self.spans(b, s, m)  # type: ignore[method-assign]
        with torch.no_grad(), steer.requests(["a", None, "b"]):
            cache = transformers.DynamicCache(config=model.config)
            r = model(input_ids=torch.tensor([[5, 6, 7], [8, 9, 10], [11, 12, 13]]), cache=cache, use_cache=True)
            tok = r.logits[:, -1].argmax(-1, keepdim=True)
            for i in range(4):
                if change and i == 2:
                    o.set_global(override({"base": {("post_block", 1): rand(20)}, "decode": {("mlp_in", 0): rand(21)}}))
                r = model(input_ids=tok, cache=cache, use_cache=True)
                out.append(r.logits[:, -1])
                tok = r.logits[:, -1].argmax(-1, keepdim=True)
                reused = reused or (steer._batch is not None and steer._batch._decode is not None)
    finally:
        _Requests.forward_spans = real  # type: ignore[method-assign]
        steer.close()
    return torch.stack(out), reused


def test_static_decode_reusing_its_packing_steers_as_the_spans(models, ns, secret):
    """The decode forwards that reuse their packed layout (and static mode's steady-step fast
    path) steer as the spans built every forward, with the global vector changed mid-decode."""
    model = models("llama")
    got = {}
    for reuse in (True, False):
        for change in (True, False):
            with owner(ns + str(reuse) + str(change), secret, GLOBAL, STEER) as o:
                got[reuse, change] = _decode_loop(model, o, reuse, change)
    assert got[True, True][1] and not got[False, True][1]
    torch.testing.assert_close(got[True, True][0], got[False, True][0], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got[True, False][0], got[False, False][0], rtol=1e-5, atol=1e-5)
    assert not torch.allclose(got[True, True][0][2:], got[True, False][0][2:]), "the change steers"
