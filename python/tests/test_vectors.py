"""Vector files from Python: PyTorch .pt files unpickled weights-only (shmsteer.vectors) and
their tensors handed to the Go importer as bytes (shmsteer_vector_import_bytes), and GGUF /
.npy / .npz / safetensors through the Go importer and exporter of the C ABI
(shmsteer_vector_import / shmsteer_vector_export)."""

from __future__ import annotations

import os
import pickle

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="torch not importable (apt-get install python3-torch)")

import shmsteer  # noqa: E402
from shmsteer import errors  # noqa: E402
from shmsteer.vectors import NotWeightsOnlyError, pt_to_bytes  # noqa: E402

HIDDEN, LAYERS = 8, 4


def bits(a) -> np.ndarray:
    """The float32 bit patterns of a (bitwise comparison, NaN-safe)."""
    return np.ascontiguousarray(a, dtype=np.float32).view(np.uint32)


def rows(seed: int, n: int = LAYERS) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, HIDDEN, generator=g, dtype=torch.float64)


def as_f32(t: torch.Tensor) -> np.ndarray:
    return t.detach().to(torch.float32).numpy()


def load_pt(owner, path, **kwargs):
    """Import the .pt file at path into owner (import_vector's kwargs; layer_range for layers)
    and return the entries as (hook, layer, data): the scale is multiplied into the data."""
    if "layer_range" in kwargs:
        kwargs["layers"] = kwargs.pop("layer_range")
    owner.import_vector("pt", path, **kwargs)
    _, ents = entries_of(owner, "pt")
    assert all(s == 1.0 for _, _, s, _ in ents)
    return [(h, layer, d) for h, layer, _, d in ents]


# Each accepted layout, saved with torch.save: (object to save, load_pt kwargs, expected entries).
def _layouts():
    r = rows(1)
    half = r.to(torch.float16)
    bf = r.to(torch.bfloat16)
    return {
        "tensor [layers, hidden] f32": (r.to(torch.float32), {}, [("post_block", i, as_f32(r[i])) for i in range(LAYERS)]),
        "tensor [hidden] with a layer range": (r[0].to(torch.float32), {"layer_range": "1-2"},
                                               [("post_block", 1, as_f32(r[0])), ("post_block", 2, as_f32(r[0]))]),
        "layers.N f16 (repeng/EasySteer)": ({f"layers.{i}": half[i] for i in (1, 3)}, {},
                                            [("post_block", i, as_f32(half[i])) for i in (1, 3)]),
        "layers.N at another hook": ({"layers.2": half[2]}, {"hook": "mlp_out"}, [("mlp_out", 2, as_f32(half[2]))]),
        "hook: [layers, hidden] bf16": ({"mlp_out": bf, "pre_attn": bf}, {},
                                        [("pre_attn", i, as_f32(bf[i])) for i in range(LAYERS)]
                                        + [("mlp_out", i, as_f32(bf[i])) for i in range(LAYERS)]),
        "hook.N f64": ({"post_attn.0": r[0], "post_attn.3": r[3].unsqueeze(0)}, {},
                       [("post_attn", 0, as_f32(r[0])), ("post_attn", 3, as_f32(r[3]))]),
        "layers.N.hook": ({"layers.1.mlp_in": r[1].to(torch.float32)}, {}, [("mlp_in", 1, as_f32(r[1]))]),
        "layer range keeps A..B": ({f"layers.{i}": r[i] for i in range(LAYERS)}, {"layer_range": (2, 3)},
                                   [("post_block", i, as_f32(r[i])) for i in (2, 3)]),
    }


@pytest.mark.parametrize("layout", list(_layouts()))
def test_load_pt_layouts(owner, tmp_path, layout):
    obj, kwargs, want = _layouts()[layout]
    path = tmp_path / "v.pt"
    torch.save(obj, path)
    got = load_pt(owner, path, **kwargs)
    assert [(h, layer) for h, layer, _ in got] == [(h, layer) for h, layer, _ in want]
    for (_, _, g), (_, _, w) in zip(got, want):
        assert g.dtype == np.float32 and g.shape == (HIDDEN,)
        np.testing.assert_array_equal(bits(g), bits(w))


def test_load_pt_scale_is_a_float32_product(owner, tmp_path):
    r = rows(2).to(torch.float32)
    torch.save(r, tmp_path / "v.pt")
    got = load_pt(owner, tmp_path / "v.pt", scale=0.3)
    for layer, (_, _, g) in enumerate(got):
        np.testing.assert_array_equal(bits(g), bits(r[layer].numpy() * np.float32(0.3)))


class Payload:
    """Unpickled normally, creates a directory: proof that code ran."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.mkdir, (self.marker,))


@pytest.mark.parametrize("how", ["pickle.dump", "torch.save"])
def test_malicious_pickle_is_refused_and_never_runs(tmp_path, how, ns, secret):
    marker = str(tmp_path / "pwned")
    path = tmp_path / "evil.pt"
    if how == "pickle.dump":
        with open(path, "wb") as f:
            pickle.dump({"layers.1": Payload(marker)}, f)
    else:
        torch.save({"layers.1": Payload(marker)}, path)
    with pytest.raises(NotWeightsOnlyError) as ei:
        pt_to_bytes(path)
    assert not os.path.exists(marker), "the payload ran"
    assert isinstance(ei.value, errors.VectorFileCorruptError) and isinstance(ei.value, ValueError)
    assert str(path) in str(ei.value) and "weights-only" in str(ei.value)
    with shmsteer.Owner(ns, secret=secret, hidden=HIDDEN, layers=LAYERS) as o:
        with pytest.raises(NotWeightsOnlyError):
            o.import_vector("evil", path)
        assert not os.path.exists(marker), "the payload ran"
        with o.snapshot() as snap:
            assert snap.vectors() == []
    # Control: the same payload does run under an ordinary unpickler, so the test can fail.
    control = str(tmp_path / "control")
    pickle.loads(pickle.dumps(Payload(control)))
    assert os.path.isdir(control)


def _save(tmp_path, obj, name="v.pt"):
    path = tmp_path / name
    torch.save(obj, path)
    return path


@pytest.mark.parametrize("obj,kwargs,exc,needles", [
    ({"layers.1": torch.tensor([0.0] * 7 + [float("nan")])}, {}, errors.NonFiniteError, ['"layers.1"', "element 7"]),
    ({"layers.1": torch.tensor([float("inf")] * HIDDEN)}, {}, errors.NonFiniteError, ['"layers.1"', "element 0"]),
    ({"layers.1": torch.ones(HIDDEN + 1)}, {}, errors.HiddenSizeError, ['"layers.1"', f"want [{HIDDEN}]", "[9]"]),
    (torch.ones(LAYERS, HIDDEN * 2), {}, errors.HiddenSizeError, ['"array"', f"want [{LAYERS}, {HIDDEN}]"]),
    (torch.ones(LAYERS + 1, HIDDEN), {}, errors.VectorFileShapeError, [f"want [{LAYERS}, {HIDDEN}]", "[5, 8]"]),
    ({"layers.2": torch.ones(2, HIDDEN)}, {}, errors.HiddenSizeError, ['"layers.2"', f"want [{HIDDEN}]"]),
    ({"layers.9": torch.ones(HIDDEN)}, {}, errors.LayerRangeError, ['"layers.9"', "layers 0..3"]),
    ({"layers.1": torch.ones(HIDDEN, dtype=torch.int32)}, {}, errors.DtypeError, ['"layers.1"', "I32"]),
    ({"layers.1": torch.tensor([1e300] * HIDDEN, dtype=torch.float64)}, {}, errors.ValueRangeError, ['"layers.1"']),
    ({"layers.1": torch.full((HIDDEN,), 1e3)}, {"scale": 1e38}, errors.NonFiniteError, ["overflows float32"]),
    (torch.ones(HIDDEN), {}, errors.NeedLayersError, ['"array"', "layer range"]),
    ({"weird": torch.ones(HIDDEN)}, {}, errors.UnknownHookError, ['"weird"', "post_block"]),
    ({"layers.01": torch.ones(HIDDEN)}, {}, errors.TensorNameError, ['"layers.01"']),
    ({"layers.1.attn": torch.ones(HIDDEN)}, {}, errors.UnknownHookError, ['"layers.1.attn"', "post_block"]),
    ({"layers.1": "text"}, {}, errors.VectorFileCorruptError, ['"layers.1"', "a str", "want a tensor"]),
    ({"layers.1": torch.ones(HIDDEN), "post_block.1": torch.ones(HIDDEN)}, {}, errors.DuplicateError, ["layer 1 given twice"]),
    ({"layers.1": torch.zeros(HIDDEN)}, {}, errors.NoVectorsError, ["steers nothing"]),
    ({"layers.1": torch.ones(HIDDEN)}, {"layer_range": "2-3"}, errors.NoVectorsError, ["after the layer range"]),
    ({"layers.1": torch.ones(HIDDEN)}, {"layer_range": "3-1"}, errors.VectorFileOptionsError, ["3-1"]),
    ({"layers.1": torch.ones(HIDDEN)}, {"scale": 1e-50}, errors.VectorFileOptionsError, ["scale 1e-50"]),
    ({"layers.1": torch.ones(HIDDEN)}, {"max_bytes": 16}, errors.VectorFileTooLargeError, ["the cap is 16"]),
])
def test_load_pt_errors_name_file_tensor_and_shape(owner, tmp_path, obj, kwargs, exc, needles):
    path = _save(tmp_path, obj)
    with pytest.raises(exc) as ei:
        load_pt(owner, path, **kwargs)
    assert isinstance(ei.value, ValueError)
    msg = str(ei.value)
    if exc not in (errors.VectorFileOptionsError,):
        assert str(path) in msg, msg
    for n in needles:
        assert n in msg, msg


def test_load_pt_corrupt_file(tmp_path):
    path = _save(tmp_path, {"layers.1": torch.ones(HIDDEN)})
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(NotWeightsOnlyError, match="v.pt"):
        pt_to_bytes(path)


@pytest.fixture
def owner(ns, secret):
    with shmsteer.Owner(ns, secret=secret, hidden=HIDDEN, layers=LAYERS) as o:
        yield o


def entries_of(h, name):
    with h.snapshot() as snap:
        nv = snap.vector(name)
        return nv.digest, [(e.hook, e.layer, e.scale, np.array(e.data)) for e in nv.entries]


def test_import_pt_then_round_trip_every_format(owner, ns, secret, tmp_path):
    r = rows(3).to(torch.float32)
    pt = _save(tmp_path, {f"layers.{i}": r[i] for i in (1, 2, 3)})
    with shmsteer.Client(ns, secret=secret) as c:
        imp = c.import_vector("pt", pt)  # a client reads the file and sends it to the owner
        digest, ents = entries_of(owner, "pt")
        assert imp.digest == digest and imp.version >= 1
        assert [(h, layer, s) for h, layer, s, _ in ents] == [("post_block", i, 1.0) for i in (1, 2, 3)]
        for (_, layer, _, d) in ents:
            np.testing.assert_array_equal(bits(d), bits(r[layer].numpy()))

        # Export to .npy; numpy reads exactly the floats (zero row for layer 0).
        c.export_vector("pt", tmp_path / "out.npy")
        a = np.load(tmp_path / "out.npy")
        assert a.dtype == np.float32 and a.shape == (LAYERS, HIDDEN)
        want = r.numpy().copy()
        want[0] = 0
        np.testing.assert_array_equal(bits(a), bits(want))

        # Every format round-trips bitwise: same digest after export and import.
        for fmt, fname in [("gguf", "out.gguf"), ("npz", "out.npz"), ("safetensors", "out.safetensors"),
                           (None, "auto.gguf"), ("npy", "forced.bin")]:
            owner.export_vector("pt", tmp_path / fname, format=fmt)
            back = owner.import_vector("back-" + fname, tmp_path / fname, format=fmt)
            assert back.digest == digest, fname
        # .pt export (torch.save, Python side) round-trips too, and torch reads it weights-only.
        c.export_vector("pt", tmp_path / "out.pt")
        saved = torch.load(tmp_path / "out.pt", weights_only=True)
        assert sorted(saved) == [f"post_block.{i}" for i in (1, 2, 3)]
        assert c.import_vector("back-pt", tmp_path / "out.pt").digest == digest
        # The same floats from .npy and from .pt encode the same.
        assert c.import_vector("npy", tmp_path / "out.npy").digest == digest


def test_import_options_through_the_c_abi(owner, tmp_path):
    a = rows(4).numpy().astype(np.float32)
    np.save(tmp_path / "a.npy", a)
    imp = owner.import_vector("s", tmp_path / "a.npy", scale=2.5, layers="1-2", hook="mlp_out")
    _, ents = entries_of(owner, "s")
    assert [(h, layer, s) for h, layer, s, _ in ents] == [("mlp_out", 1, 1.0), ("mlp_out", 2, 1.0)]
    for (_, layer, _, d) in ents:
        np.testing.assert_array_equal(bits(d), bits(a[layer] * np.float32(2.5)))
    # The same options on the same floats from a .pt file give the same vector.
    pt = _save(tmp_path, torch.from_numpy(a))
    assert owner.import_vector("s-pt", pt, scale=2.5, layers=(1, 2), hook="mlp_out").digest == imp.digest
    # A [hidden] array needs a layer range.
    np.save(tmp_path / "one.npy", a[0])
    with pytest.raises(errors.NeedLayersError):
        owner.import_vector("one", tmp_path / "one.npy")
    owner.import_vector("one", tmp_path / "one.npy", layers=3)
    assert [layer for _, layer, _, _ in entries_of(owner, "one")[1]] == [3]


def test_import_export_errors_through_the_c_abi(owner, tmp_path):
    bad = np.ones((LAYERS, HIDDEN), np.float32)
    bad[2, 5] = np.inf
    np.save(tmp_path / "inf.npy", bad)
    np.save(tmp_path / "wide.npy", np.ones((LAYERS, HIDDEN + 1), np.float32))
    np.save(tmp_path / "ok.npy", np.ones((LAYERS, HIDDEN), np.float32))
    (tmp_path / "trunc.npy").write_bytes((tmp_path / "ok.npy").read_bytes()[:100])
    (tmp_path / "junk.xyz").write_bytes(b"nothing known")
    cases = [
        (lambda: owner.import_vector("x", tmp_path / "inf.npy"), errors.NonFiniteError, "inf.npy"),
        (lambda: owner.import_vector("x", tmp_path / "wide.npy"), errors.HiddenSizeError, "wide.npy"),
        (lambda: owner.import_vector("x", tmp_path / "trunc.npy"), errors.VectorFileCorruptError, "trunc.npy"),
        (lambda: owner.import_vector("x", tmp_path / "junk.xyz"), errors.UnknownFormatError, "junk.xyz"),
        (lambda: owner.import_vector("x", tmp_path / "ok.npy", max_bytes=64), errors.VectorFileTooLargeError, "ok.npy"),
        (lambda: owner.import_vector("x", tmp_path / "ok.npy", format="gguf"), errors.VectorFileCorruptError, "ok.npy"),
        (lambda: owner.import_vector("x", tmp_path / "ok.npy", hook="nope"), errors.UnknownHookError, "nope"),
        (lambda: owner.import_vector("x", tmp_path / "ok.npy", layers="2-1"), errors.VectorFileOptionsError, "2-1"),
        (lambda: owner.import_vector("x", tmp_path / "ok.npy", layers=7), errors.NoVectorsError, "ok.npy"),
        (lambda: owner.import_vector("x", tmp_path / "ok.npy", scale=float("nan")), errors.VectorFileOptionsError, "nan"),
        (lambda: owner.import_vector("x", tmp_path / "ok.npy", scale=1e-50), errors.VectorFileOptionsError, "1e-50"),
        (lambda: owner.import_vector("x", tmp_path / "missing.npy"), FileNotFoundError, "missing.npy"),
        (lambda: owner.export_vector("x", tmp_path / "x.npy"), errors.UnknownVectorError, "x"),
    ]
    for call, exc, needle in cases:
        with pytest.raises(exc) as ei:
            call()
        assert needle in str(ei.value), str(ei.value)
    with owner.snapshot() as snap:
        assert snap.vectors() == [], "a failed import registers nothing"

    owner.register_vector("two-hooks", [("mlp_out", 1, 1.0, np.ones(HIDDEN, np.float32)),
                                        ("post_block", 1, 1.0, np.ones(HIDDEN, np.float32))])
    for fmt in ("gguf", "npy"):
        with pytest.raises(errors.UnrepresentableError):
            owner.export_vector("two-hooks", tmp_path / f"t.{fmt}")
        assert not (tmp_path / f"t.{fmt}").exists(), "a failed export leaves no file"
    with pytest.raises(errors.UnknownFormatError):
        owner.export_vector("two-hooks", tmp_path / "t.bin")
    owner.export_vector("two-hooks", tmp_path / "t.npz")
    with np.load(tmp_path / "t.npz") as z:
        assert sorted(z.files) == ["mlp_out", "post_block"]


def test_go_owner_export_and_import_from_a_python_worker(go_owner, ns, secret, tmp_path):
    # The Go owner's fixture vector "v1": post_block, layer 1, data i*0.25, hidden 64, 4 layers.
    fixture = np.arange(64, dtype=np.float32) * np.float32(0.25)
    with shmsteer.Client(ns, secret=secret) as c:
        c.export_vector("v1", tmp_path / "v1.npy")
        a = np.load(tmp_path / "v1.npy")
        want = np.zeros((4, 64), np.float32)
        want[1] = fixture
        np.testing.assert_array_equal(bits(a), bits(want))
        # A worker imports a file: it reads it and the owner registers the vectors.
        c.export_vector("v1", tmp_path / "v1.gguf")
        imp = c.import_vector("v1-again", tmp_path / "v1.gguf", scale=2.0)
        with c.snapshot(imp.version) as snap:
            e = snap.vector("v1-again").entries
            assert [(x.hook, x.layer) for x in e] == [("post_block", 1)]
            np.testing.assert_array_equal(bits(e[0].data), bits(fixture * np.float32(2)))
            del e


def test_forked_child_gets_forked_error_from_vector_files(owner, tmp_path):
    from workers import wait_forked
    np.save(tmp_path / "a.npy", np.ones((LAYERS, HIDDEN), np.float32))
    owner.import_vector("a", tmp_path / "a.npy")
    pid = os.fork()
    if pid == 0:  # the child: the C wrappers refuse before anything enters Go
        code = 0
        for call in (lambda: owner.import_vector("b", tmp_path / "a.npy"),
                     lambda: owner.export_vector("a", tmp_path / "child.npy")):
            try:
                call()
                code |= 1
            except errors.ForkedError:
                pass
            except BaseException:
                code |= 2
        os._exit(code)
    assert wait_forked(pid) == 0
    assert not (tmp_path / "child.npy").exists()
    owner.export_vector("a", tmp_path / "parent.npy")  # the parent is unaffected


def test_export_multiplies_the_scale_in_every_format(owner, tmp_path):
    d = rows(5)[2].to(torch.float32).numpy()
    owner.register_vector("half", [("post_block", 2, 0.5, d)])
    want = d * np.float32(0.5)
    owner.export_vector("half", tmp_path / "h.npy")
    np.testing.assert_array_equal(bits(np.load(tmp_path / "h.npy")[2]), bits(want))
    owner.export_vector("half", tmp_path / "h.pt")
    (hook, layer, got), = load_pt(owner, tmp_path / "h.pt")
    assert (hook, layer) == ("post_block", 2)
    np.testing.assert_array_equal(bits(got), bits(want))
    assert owner.import_vector("a", tmp_path / "h.npy").digest == owner.import_vector("b", tmp_path / "h.pt").digest
