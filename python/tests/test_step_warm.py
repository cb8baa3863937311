"""A step that stays warm in a serving loop (issue 43, item 1): what a steady or advancing
decode batch reuses from the last step (its span packing, the resolve's views, the device
path's tables and index), and that the reuse never hands out a stale value."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="torch not importable (apt-get install python3-torch)")

import shmsteer  # noqa: E402
from shmsteer.device import SpanPacker  # noqa: E402
from shmsteer.errors import InvalidArgumentError  # noqa: E402
from shmsteer.torch_hook import SteeringHooks  # noqa: E402

from steering_ref import HIDDEN, HOOKS, LAYERS, Chain, Scenario, attach  # noqa: E402


@pytest.fixture
def owner(ns, secret):
    with shmsteer.Owner(ns, secret=secret, hidden=HIDDEN, layers=LAYERS, hooks=list(HOOKS) + ["mlp_out"]) as o:
        yield o


def test_packer_advances_positions_in_place():
    p = SpanPacker()
    a = p.pack([("a", 0, 1, "decode", 7), ("b", 1, 2, "decode", 3)])
    assert p.packs == 1 and list(a.arr["first_position"]) == [7, 3]
    b = p.pack([("a", 0, 1, "decode", 8), ("b", 1, 2, "decode", 4)])
    assert b is a and p.packs == 1, "positions only: the packing is reused"
    assert list(b.arr["first_position"]) == [8, 4]
    assert p.pack([("a", 0, 1, "decode", 8), ("b", 1, 2, "decode", 4)]) is a and p.packs == 1
    # Anything else about a span packs again: its row range, its phase, its id, their number.
    for spans in ([("a", 0, 1, "decode", 9), ("b", 1, 3, "decode", 5)],
                  [("a", 0, 1, "prefill", 9), ("b", 1, 3, "decode", 5)],
                  [("c", 0, 1, "prefill", 9), ("b", 1, 3, "decode", 5)],
                  [("c", 0, 1, "prefill", 9)]):
        before = p.packs
        got = p.pack(spans)
        assert p.packs == before + 1
        assert [tuple(r) for r in got.arr[["start", "end", "first_position"]].tolist()] == [s[1:3] + (s[4],) for s in spans]
    # A bad position is refused by the full packing, as before (nothing reused).
    p.pack([("a", 0, 1, "decode", 1)])
    with pytest.raises(InvalidArgumentError):
        p.pack([("a", 0, 1, "decode", 1 << 31)])
    with pytest.raises(InvalidArgumentError):
        p.pack([("a", 0, 1, "decode", 2.0)])
    # Spans given as lists, mutated by the caller between steps, are packed again.
    spans = [["a", 0, 1, "decode", 1]]
    p.pack(spans)
    spans[0][4] = 2
    assert list(p.pack(spans).arr["first_position"]) == [2]


def test_packer_fast_records_equal_the_general_ones():
    """A changed batch of 5-tuples with ids packed before takes the packer's short loop
    (``_records``); it packs what the general loop packs, and anything it does not take (a new
    id, numpy ints, a bool, a phase constant, a negative position, a bad phase or position) goes to the general loop,
    with its typed errors."""
    from shmsteer import PHASE_DECODE
    p = SpanPacker()
    p.pack([("a", 0, 1, "prefill", 0), ("b", 1, 2, "decode", 3)])  # the ids, packed once
    spans = [("b", 0, 2, "decode", 4), ("a", 2, 3, "decode", 9)]
    assert p._records(spans) is not None
    fast = p.pack(spans).arr.copy()
    fresh = SpanPacker()
    assert fresh._records(spans) is None  # ids not packed before: the general loop
    slow = fresh.pack(spans).arr
    assert fast[["id_len", "start", "end", "phase", "first_position"]].tolist() == \
        slow[["id_len", "start", "end", "phase", "first_position"]].tolist()
    for odd in ([("a", np.int64(0), 1, "decode", 1)], [("a", 0, 1, PHASE_DECODE, 1)], [("a", 0, True, "decode", 1)],
                [("c", 0, 1, "decode", 1)], [("a", 0, 1, "decode", -1)]):
        assert p._records(odd) is None
        assert p.pack(odd).arr["end"].tolist() == [1]
    for bad in ([("a", 0, 1, "decoding", 1)], [("a", 0, 1, "decode", 1 << 31)], [("a", 0, 1, "decode", 1.0)]):
        assert p._records(bad) is None
        with pytest.raises(InvalidArgumentError):
            p.pack(bad)


def test_resolve_views_reused_and_current(owner):
    Scenario(owner)
    hooks = SteeringHooks(owner, force_device_path=True)
    attach(hooks, Chain())
    b = hooks.batch
    spans = [("a", 0, 3, "decode"), ("b", 3, 5, "decode")]
    r1 = b.resolve(hooks._packer.pack(spans), 5, end=True)
    idx1 = r1.index.copy()
    r2 = b.resolve(hooks._packer.pack(spans), 5, end=True)
    assert r2.index is r1.index, "a steady batch makes no new view"
    assert (r2.index == idx1).all() and len(r2.updates) == 0
    # Another layout: the views show the new results, not the cached ones.
    swapped = [("b", 0, 2, "decode"), ("a", 2, 5, "decode")]
    r3 = b.resolve(hooks._packer.pack(swapped), 5, end=True)
    assert list(r3.index) == [idx1[3]] * 2 + [idx1[0]] * 3
    r4 = b.resolve(hooks._packer.pack(swapped[:1]), 2, end=True)
    assert r4.index.shape == (2,) and list(r4.index) == [idx1[3]] * 2


def _steered(hooks, chain, x, spans):
    y = x.clone()
    with torch.no_grad(), hooks.step(spans):
        chain(y)
    return y


def _device_and_native(owner):
    """Device-path hooks (on CPU tensors) and native hooks, each on a chain of its own."""
    chain_d, chain_n = Chain(), Chain()
    dev = SteeringHooks(owner, force_device_path=True)
    nat = SteeringHooks(owner)
    attach(dev, chain_d)
    attach(nat, chain_n)
    return dev, chain_d, nat, chain_n


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_device_addends_follow_layout_and_tables(owner, dtype):
    """The device path's kept gathered rows give what the gather gives (the native path's
    result), and are remade when the layout or a table row changes."""
    sc = Scenario(owner, clamps=False)
    dev, chain_d, nat, chain_n = _device_and_native(owner)
    x = torch.randn(6, HIDDEN).to(dtype)
    steps = [[("a", 0, 1, "decode", 5), ("b", 1, 2, "decode", 3)],
             [("a", 0, 1, "decode", 6), ("b", 1, 2, "decode", 4)],  # advancing: addends kept
             [("b", 0, 1, "decode", 5), ("a", 1, 2, "decode", 7)],  # swapped rows: remade
             [("b", 0, 1, "decode", 6), ("a", 1, 2, "decode", 8)]]
    for i, spans in enumerate(steps):
        if i == 3:
            sc.register("n0", [("post_block", l, 2.0, np.full(HIDDEN, 0.25 * (l + 1), np.float32)) for l in range(LAYERS)])
        kept = dict(dev._addends)
        got = _steered(dev, chain_d, x, spans)
        want = _steered(nat, chain_n, x, spans)
        tol = 1e-5 if dtype is torch.float32 else 0.05
        torch.testing.assert_close(got.float(), want.float(), rtol=tol, atol=tol)
        assert dev._addends, "clamp-free sites keep their gathered rows"
        same = bool(kept) and all(dev._addends[s] is kept.get(s) for s in dev._addends)
        assert same == (i == 1), f"step {i}: addends {'kept' if same else 'remade'}"
    assert not torch.equal(got, x)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_device_stacked_tables_grow(owner, dtype):
    """The device path's tables are views of one store, and a layout's kept rows come from one
    gather of it: a batch of more slots than the store has rows, then sites past its sites,
    grow it (the views move, the rows written before stay); every step equals the native
    path's."""
    sc = Scenario(owner, clamps=False)
    sc.set_global({})
    for i in range(24):
        sc.admit(f"r{i}", {"decode": {"vectors": [sc.vec("post_block", i % LAYERS, 0.5 + 0.1 * i)]}})
    dev, chain_d, nat, chain_n = _device_and_native(owner)
    x = torch.randn(24, HIDDEN).to(dtype)
    tol = 1e-5 if dtype is torch.float32 else 0.05

    def batch(ids, pos):
        return [(f"r{i}", j, j + 1, "decode", pos) for j, i in enumerate(ids)]

    few, many = [0, 1, 2], list(range(24))
    moves = []
    for spans in (batch(few, 1), batch(few, 2), batch(many, 3), batch(many, 4), batch(few, 5)):
        n = len(spans)
        got = _steered(dev, chain_d, x[:n], spans)
        want = _steered(nat, chain_n, x[:n], spans)
        torch.testing.assert_close(got.float(), want.float(), rtol=tol, atol=tol)
        tb = dev._tables
        assert dev._stacked and dev._addends and not dev._due
        for s, add in dev._addends.items():
            assert add.data_ptr() != tb.sites[s].vec.data_ptr()
            assert torch.equal(add, tb.sites[s].vec.index_select(0, dev._idx)), f"site {s}: the stacked gather's rows"
        moves.append(tb.moves)
    assert moves[2] > moves[1], "24 slots grew the store"
    # A site no request steered yet: a new row of sites in the store, the rows before kept.
    sc.admit("late", {"decode": {"vectors": [sc.vec("pre_attn", 3, 2.0), sc.vec("pre_attn", 2, 1.0),
                                             sc.vec("pre_attn", 1, 1.0), sc.vec("pre_attn", 0, 1.0)]}})
    for spans in (batch(few, 6) + [("late", 3, 4, "decode", 0)], batch(few, 7) + [("late", 3, 4, "decode", 1)]):
        got = _steered(dev, chain_d, x[:4], spans)
        want = _steered(nat, chain_n, x[:4], spans)
        torch.testing.assert_close(got.float(), want.float(), rtol=tol, atol=tol)
    assert len(dev._tables.order) == 2 * LAYERS
    assert dev._tables.moves == moves[-1], "the store held the attached sites from the start"


def test_device_tables_store_grows_in_sites_and_rows():
    """Tables that grow: a site past the store's sites, and slots past its rows, make a new
    store holding every row written before; gather takes each site's rows in order."""
    from shmsteer.device import DeviceTables
    tb = DeviceTables(8, "cpu", torch.float32, 0, capacity=2, site_capacity=1)
    for n, s in enumerate((5, 1, 9)):
        tb._site(s).vec[1] = float(n + 1)  # each site's slot 1
    assert tb.order == [5, 1, 9] and tb.moves == 3  # 1 site, then 2, then 4
    tb._grow(5)
    assert tb.capacity == 8 and tb.moves == 4
    tb.sites[9].vec[7] = -1.0
    got = tb.gather(torch.tensor([1, 0, 7]))
    assert got.shape == (3, 3, 8)
    for i, s in enumerate(tb.order):
        assert torch.equal(got[i], tb.sites[s].vec.index_select(0, torch.tensor([1, 0, 7])))
        assert got[i, 0].eq(float(i + 1)).all() and got[i, 1].eq(0).all()
    assert got[2, 2].eq(-1).all() and got[:2, 2].eq(0).all()


def test_device_gather_views_kept_per_size(owner):
    """The device path's gather buffer view of a layout's steered rows is kept per row count: a
    batch whose size goes back and forth makes no view again, a larger one grows the buffer
    (the views of the smaller one are made again, of the new buffer); every step gives what the
    native path gives, clamped sites (which gather into the view at each step) included."""
    Scenario(owner)
    dev, chain_d, nat, chain_n = _device_and_native(owner)
    x = torch.randn(8, HIDDEN)
    two = [("a", 0, 1, "decode", 5), ("b", 1, 2, "decode", 3)]
    one = [("b", 0, 1, "decode", 4)]
    four = [("a", 0, 1, "decode", 6), ("b", 1, 2, "decode", 5), ("c", 2, 3, "decode", 2), ("d", 3, 4, "decode", 1)]
    seen = []
    for spans in (two, one, two, four, two):
        got = _steered(dev, chain_d, x, spans)
        want = _steered(nat, chain_n, x, spans)
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
        assert dev._scratch[0].shape[0] == dev._k and dev._scratch[0].data_ptr() == dev._gather.data_ptr()
        seen.append((dev._k, dev._scratch, dev._gather))
    (k2, s2, g2), (k1, s1, _), (k2b, s2b, _), (k4, _, g4), (k2c, s2c, g2c) = seen
    assert k2 == k2b == k2c == 2 and k1 == 1 and k4 == 4
    assert s2b is s2, "back to two rows: the view made for two rows"
    assert g4 is not g2 and g4.shape[0] >= 4, "four rows grew the gather buffer"
    assert s2c is not s2 and g2c is g4, "two rows again: a view of the grown buffer"


def _static_and_native(owner, dtype):
    """Clamp-free static hooks (max_tokens 4) and native hooks, each on a chain of its own."""
    chain_s, chain_n = Chain(), Chain()
    st = SteeringHooks(owner, static=True, max_tokens=4, device="cpu", dtype=dtype, max_clamps=0)
    nat = SteeringHooks(owner)
    attach(st, chain_s)
    attach(nat, chain_n)
    assert st._addends, "clamp-free static sites add prepared rows"
    return st, chain_s, nat, chain_n


def _prepared(st, chain, x, spans):
    y = x.clone()
    with torch.no_grad():
        st.prepare(spans)
        chain(y)
    return y


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_static_addends_follow_layout_and_tables(owner, dtype):
    """Static mode without clamps adds rows prepare gathered: equal to the native path's result
    over an advancing, a reordered and a re-registered step, and rows past the batch untouched."""
    sc = Scenario(owner, clamps=False)
    st, chain_s, nat, chain_n = _static_and_native(owner, dtype)
    x = torch.randn(3, HIDDEN).to(dtype)
    steps = [[("a", 0, 1, "decode", 5), ("b", 1, 2, "decode", 3)],
             [("a", 0, 1, "decode", 6), ("b", 1, 2, "decode", 4)],
             [("b", 0, 1, "decode", 5), ("a", 1, 2, "decode", 7)],
             [("b", 0, 1, "decode", 6), ("a", 1, 2, "decode", 8)]]
    tol = 1e-5 if dtype is torch.float32 else 0.05
    for i, spans in enumerate(steps):
        if i == 3:
            sc.register("n0", [("post_block", l, 2.0, np.full(HIDDEN, 0.25 * (l + 1), np.float32)) for l in range(LAYERS)])
        y = _prepared(st, chain_s, x, spans)
        want = _steered(nat, chain_n, x, spans)
        torch.testing.assert_close(y.float(), want.float(), rtol=tol, atol=tol)
        assert torch.equal(y[2], x[2]), "a row past the batch is not steered"


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_static_eager_rows_go_back_and_forth(owner, dtype):
    """Eager static mode over hidden states of fewer rows than max_tokens, their number going
    back and forth (its addends' first rows kept per row count): each step equals the native
    path's."""
    Scenario(owner, clamps=False)
    st, chain_s, nat, chain_n = _static_and_native(owner, dtype)
    x = torch.randn(4, HIDDEN).to(dtype)
    tol = 1e-5 if dtype is torch.float32 else 0.05
    three = [("a", 0, 1, "decode", 5), ("b", 1, 3, "decode", 3)]
    one = [("b", 0, 1, "decode", 4)]
    four = [("a", 0, 1, "decode", 6), ("b", 1, 2, "decode", 5), ("c", 2, 4, "decode", 2)]
    for spans in (three, one, three, four, one, three):
        n = spans[-1][2]
        y = _prepared(st, chain_s, x[:n], spans)
        want = _steered(nat, chain_n, x[:n], spans)
        torch.testing.assert_close(y.float(), want.float(), rtol=tol, atol=tol)


def test_packer_passes_packed_spans_through():
    """Spans already packed are the packing (nothing packed again), and leave the packer's own
    reuse as it was: its next list of spans still compares with the last list it packed."""
    p, other = SpanPacker(), SpanPacker()
    a = p.pack([("a", 0, 1, "decode", 7)])
    theirs = other.pack([("b", 0, 2, "prefill", 0)])
    assert p.pack(theirs) is theirs and p.packs == 1
    again = p.pack([("a", 0, 1, "decode", 8)])
    assert again is a and p.packs == 1 and list(again.arr["first_position"]) == [8]
    assert list(theirs.arr["first_position"]) == [0], "a packing passed through is not written"


def test_resolve_result_reused_only_while_the_answer_is_the_same(owner):
    """A resolve whose answer (buffers, lengths, counts) is the last one's hands back the same
    Resolved, its version and checksum current; positions advancing, a row leaving or joining,
    a vector changing version are each seen (never a stale index, update list or checksum)."""
    sc = Scenario(owner, clamps=False)
    hooks = SteeringHooks(owner, force_device_path=True)
    attach(hooks, Chain())
    b = hooks.batch

    def resolve(spans):
        return b.resolve(hooks._packer.pack(spans), sum(s[2] - s[1] for s in spans), end=True)

    r0 = resolve([("a", 0, 1, "decode", 5), ("b", 1, 2, "decode", 3)])
    v0 = r0.version
    assert len(r0.updates) > 0, "the first step writes the tables"
    r1 = resolve([("a", 0, 1, "decode", 5), ("b", 1, 2, "decode", 3)])
    assert r1 is not r0 and len(r1.updates) == 0
    idx1, sum1 = r1.index.copy(), r1.checksum
    r2 = resolve([("a", 0, 1, "decode", 5), ("b", 1, 2, "decode", 3)])
    assert r2 is r1 and r2.checksum == sum1 and len(r2.updates) == 0
    r3 = resolve([("a", 0, 1, "decode", 6), ("b", 1, 2, "decode", 4)])  # advancing
    assert r3 is r1 and r3.checksum == b._info.checksum and list(r3.index) == list(idx1)
    owner.register_vector("unused", [("post_block", 0, 1.0, np.ones(HIDDEN, np.float32))])  # a new version
    r3b = resolve([("a", 0, 1, "decode", 6), ("b", 1, 2, "decode", 4)])
    assert r3b is r1 and r3b.version == b._info.version and r3b.version > v0
    r4 = resolve([("b", 0, 1, "decode", 5)])  # a leaves
    assert r4 is not r1 and list(r4.index) == [idx1[1]]
    r5 = resolve([("b", 0, 1, "decode", 6), ("a", 1, 2, "decode", 7)])  # a joins again, swapped
    assert list(r5.index) == [idx1[1], idx1[0]]
    sc.register("n1", [("post_block", 1, 2.0, np.full(HIDDEN, 0.5, np.float32))])  # a's vector changes
    r6 = resolve([("b", 0, 1, "decode", 7), ("a", 1, 2, "decode", 8)])
    assert len(r6.updates) > 0 and r6.checksum == b._info.checksum
    r7 = resolve([("b", 0, 1, "decode", 8), ("a", 1, 2, "decode", 9)])
    assert len(r7.updates) == 0, "the update list is the resolve's, not the last one's"


def test_static_prepare_fast_path_follows_the_batch(owner, monkeypatch):
    """Static mode's steady-step fast path (no table row, gate or capture: only the index when
    it changed) steers as the native path over an advancing step, a request leaving, one
    joining, rows swapped and a vector changing; the tables are written only for the change."""
    sc = Scenario(owner, clamps=False)
    chain_s, chain_n = Chain(), Chain()
    st = SteeringHooks(owner, static=True, max_tokens=4, device="cpu", dtype=torch.float32, max_clamps=0)
    nat = SteeringHooks(owner)
    attach(st, chain_s)
    attach(nat, chain_n)
    updates: list = []
    real = st._tables.update
    monkeypatch.setattr(st._tables, "update", lambda r: (updates.append(len(r.updates)), real(r)))
    x = torch.randn(3, HIDDEN)
    steps = [[("a", 0, 1, "decode", 5), ("b", 1, 2, "decode", 3)],
             [("a", 0, 1, "decode", 6), ("b", 1, 2, "decode", 4)],
             [("b", 0, 1, "decode", 5)],
             [("b", 0, 1, "decode", 6), ("c", 1, 2, "decode", 2)],
             [("c", 0, 1, "decode", 3), ("b", 1, 2, "decode", 7)],
             [("c", 0, 1, "decode", 4), ("b", 1, 2, "decode", 8)]]
    for i, spans in enumerate(steps):
        if i == 5:
            sc.register("n0", [("post_block", l, 2.0, np.full(HIDDEN, 0.25 * (l + 1), np.float32)) for l in range(LAYERS)])
        before = len(updates)
        y = x.clone()
        with torch.no_grad():
            st.prepare(spans)
            chain_s(y)
        want = _steered(nat, chain_n, x, spans)
        torch.testing.assert_close(y, want, rtol=1e-5, atol=1e-5)
        if i in (1, 2, 4):
            assert len(updates) == before, f"step {i}: the fast path writes no table"
        assert not torch.equal(y[0], x[0]), f"step {i}: row 0 steered"
    assert updates[-1] > 0, "the changed vector's rows were written"


def test_gateless_resolves_keep_one_gates_object_per_size(owner):
    """A batch without gates whose size goes back and forth makes its empty gates once per size."""
    Scenario(owner, clamps=False)
    hooks = SteeringHooks(owner, force_device_path=True)
    attach(hooks, Chain())
    b = hooks.batch
    two = [("a", 0, 1, "decode", 5), ("b", 1, 2, "decode", 3)]
    one = [("a", 0, 1, "decode", 6)]
    g2 = b.resolve(hooks._packer.pack(two), 2, end=True).gates
    g1 = b.resolve(hooks._packer.pack(one), 1, end=True).gates
    again = b.resolve(hooks._packer.pack(two), 2, end=True).gates
    assert g1 is not g2 and again is g2
    assert g2.cols == 0 and g2.rows.shape == (2, 0) and g1.rows.shape == (1, 0)


def test_resolve_views_found_again_when_the_size_comes_back(owner):
    """A batch whose size goes back and forth (a request finishing, another joining) finds the
    views it made for each size again, showing the current answer."""
    Scenario(owner, clamps=False)
    hooks = SteeringHooks(owner, force_device_path=True)
    attach(hooks, Chain())
    b = hooks.batch
    two = [("a", 0, 1, "decode", 5), ("b", 1, 2, "decode", 3)]
    one = [("b", 0, 1, "decode", 6)]
    i2 = b.resolve(hooks._packer.pack(two), 2, end=True).index
    slots = i2.tolist()
    i1 = b.resolve(hooks._packer.pack(one), 1, end=True).index
    assert i1.tolist() == slots[1:]
    swapped = [("b", 0, 1, "decode", 7), ("a", 1, 2, "decode", 6)]
    again = b.resolve(hooks._packer.pack(swapped), 2, end=True).index
    assert again is i2 and again.tolist() == slots[::-1], "the size's view, showing the new answer"


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_device_row_index_both_forms(owner, dtype):
    """The device path's row index made by the extension (into a kept host buffer, its views
    kept per count) and by numpy: the same rows and slots, the same outputs (the native path's)
    over layouts with unsteered rows (gaps, rows past the spans), every row steered, none, and a
    batch past the buffer's first size; each layout's first step gathers the rows its later
    steps add."""
    Scenario(owner, clamps=False)
    chains = [Chain(), Chain(), Chain()]
    fast, slow = SteeringHooks(owner, force_device_path=True), SteeringHooks(owner, force_device_path=True)
    nat = SteeringHooks(owner)
    slow._index_rows = None
    for h, c in zip((fast, slow, nat), chains):
        attach(h, c)
    wide = [(("a", "b", "c", "d")[i % 4], i, i + 1, "decode", 4 + i) for i in range(70)]  # ids repeat: one slot each
    layouts = [
        ([("a", 0, 1, "decode", 5), ("b", 3, 4, "decode", 3)], 6),  # gaps and rows past the spans
        ([("a", 0, 1, "decode", 6), ("b", 3, 4, "decode", 4)], 6),  # advanced: kept
        ([("b", 0, 1, "decode", 5), ("a", 1, 2, "decode", 7)], 2),  # every row steered
        ([("b", 0, 1, "decode", 6), ("a", 1, 2, "decode", 8)], 2),
        ([], 3),  # no steered row
        (wide, 72),  # past the kept buffer's 64 rows
        ([("a", 0, 1, "decode", 5), ("b", 3, 4, "decode", 3)], 6),
    ]
    x = torch.randn(72, HIDDEN).to(dtype)
    for i, (spans, rows) in enumerate(layouts):
        outs = []
        for h, c in zip((fast, slow, nat), chains):
            y = x[:rows].clone()
            with torch.no_grad(), h.step(spans, rows=rows):
                c(y)
            outs.append(y)
        tol = 1e-5 if dtype is torch.float32 else 0.05
        assert torch.equal(outs[0], outs[1]), f"layout {i}"
        torch.testing.assert_close(outs[0].float(), outs[2].float(), rtol=tol, atol=tol)
        assert fast._idx.tolist() == slow._idx.tolist(), f"layout {i}"
        assert (fast._rowsel is None) == (slow._rowsel is None), f"layout {i}"
        if fast._rowsel is not None:
            assert fast._rowsel.tolist() == slow._rowsel.tolist(), f"layout {i}"
        if spans:
            assert not fast._due and fast._addends, f"layout {i}: the first step gathered the rows"
    if shmsteer.device.INDEX_ROWS is not None:
        assert fast._host_idx is not None and fast._host_idx.shape[0] >= 2 * 72
