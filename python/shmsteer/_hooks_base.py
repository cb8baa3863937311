"""The interface every steering-hook mode implements, and the factory choosing the mode.

``SteeringHooks(handle, ...)`` builds one of three classes, chosen at construction (see
:mod:`shmsteer.torch_hook` for what each does):

* :class:`~shmsteer._hooks_native.NativeHooks`: CPU tensors, the engine's native kernels.
* :class:`~shmsteer._hooks_device.DeviceHooks`: the eager device path (``force_device_path=True``,
  or ``device=`` a non-CPU device): per-site tables and one gather-add per site.
* :class:`~shmsteer._hooks_static.StaticHooks`: static (CUDA-graph / ``torch.compile``) mode
  (``static=True``): persistent buffers that ``prepare`` writes between steps.

Each is a :class:`SteeringHooks` (``isinstance`` holds), with the same attributes set in
``__init__`` whatever the mode.
"""

from __future__ import annotations

from typing import Any, Callable, ContextManager, List, Optional, Sequence, Tuple

import torch

from .client import SpanLike, Stepper, _Handle
from .device import Resolved, SpanPacker, StepBatch, UnsupportedDtypeError
from .errors import LayerRangeError


#: The most bytes of gathered rows (rows x hidden, all sites together) the device path and
#: static mode keep from step to step, so that a clamp-free site of a steady batch adds its rows
#: without gathering them again: 16 MiB, e.g. 64 decode rows x 4096 x 2 bytes at 32 sites.
ADDEND_BYTES = 16 << 20


class DeviceMismatchError(UnsupportedDtypeError):
    """A hooked output on a device the hooks were not built for (a CUDA tensor reaching native
    CPU hooks, or a site on another device or in another dtype than the tables). Nothing was
    changed."""


def _sited_forward(self: torch.nn.Module, *args: Any, **kwargs: Any) -> Any:
    """A module's forward with its steering sites (:class:`SiteHandle`): the input sites on its
    first input, the forward it replaced, then the output sites on its output. A method bound to
    the module (not a closure), so a ``copy.deepcopy`` of the module binds its copy."""
    out_sites, inner, in_sites = self.__dict__["_shmsteer_sites"]
    if in_sites:
        x = args[0] if args else next(iter(kwargs.values()), None)
        if isinstance(x, torch.Tensor):
            for f in in_sites:
                f(x)
    out = type(self).forward(self, *args, **kwargs) if inner is None else inner(*args, **kwargs)
    if out_sites:
        t = out[0] if isinstance(out, (tuple, list)) else out
        for f in out_sites:
            f(t)
    return out


class SiteHandle:
    """One site attached to a module by :meth:`SteeringHooks.attach`; ``remove()`` detaches it.

    The module's ``forward`` becomes :func:`_sited_forward` bound to it (an instance attribute),
    which runs the input sites on the first input, calls the forward it replaced (the class's,
    or an instance attribute set before), then runs the output sites on the output, each in the
    order attached. Not a module hook: dynamo guards the forward a compiled graph traced, so
    sites attached or removed after compiling recompile it. Removing the last site restores the
    forward it replaced, unless something has replaced the module's forward since (then that
    stays, and the sited forward it may call runs no site)."""

    __slots__ = ("_module", "_fn", "_sites")

    def __init__(self, module: torch.nn.Module, fn: Callable[[torch.Tensor], None], input: bool = False) -> None:
        cur = module.__dict__.get("forward")
        if getattr(cur, "__func__", None) is not _sited_forward:
            module.__dict__["_shmsteer_sites"] = ([], cur, [])  # cur None: the class's forward
            module.forward = _sited_forward.__get__(module)  # type: ignore[method-assign]
        state = module.__dict__["_shmsteer_sites"]
        sites: List[Callable[[torch.Tensor], None]] = state[2] if input else state[0]
        sites.append(fn)
        self._module, self._fn, self._sites = module, fn, sites

    def remove(self) -> None:
        """Detach the site (idempotent)."""
        if self._fn in self._sites:
            self._sites.remove(self._fn)
        d = self._module.__dict__
        state = d.get("_shmsteer_sites")
        if state is None or (self._sites is not state[0] and self._sites is not state[2]) or state[0] or state[2]:
            return  # another generation of sites, or sites still attached
        if getattr(d.get("forward"), "__func__", None) is _sited_forward:
            if state[1] is None:
                del d["forward"]
            else:
                d["forward"] = state[1]
            del d["_shmsteer_sites"]


def _wants_device_path(force_device_path: bool, device: Any) -> bool:
    return force_device_path or (device is not None and torch.device(device).type != "cpu")


class _Step:
    """What :meth:`SteeringHooks.step` returns: begins the step on entry, ends it on exit. A
    plain object rather than a ``contextlib.contextmanager`` generator: a step's host work runs
    with the caches the model's forward left cold, where every frame entered and object made
    costs (the generator's machinery was about 20 µs of a decode step's 200 µs of host work)."""

    __slots__ = ("_hooks", "_spans", "_version", "_rows")

    def __init__(self, hooks: "SteeringHooks", spans: Sequence[SpanLike], version: int, rows: Optional[int]) -> None:
        self._hooks, self._spans, self._version, self._rows = hooks, spans, version, rows

    def __enter__(self) -> Any:
        self._hooks._step_begin(self._spans, self._version, self._rows)
        return self._hooks

    def __exit__(self, *exc: Any) -> None:
        self._hooks._step_end()


class SteeringHooks:
    """Steering forward hooks sharing one stepper, one per-step batch and one batch layout.

    ``SteeringHooks(...)`` is the factory: it returns the class of the mode the arguments name
    (native CPU, eager device, static); every one has this interface.

    Args:
        handle: a :class:`~shmsteer.Client` or :class:`~shmsteer.Owner`.
        force_device_path: use the device path (tables, one gather-add) even for CPU tensors; for
            tests of that path, and what a GPU worker's host work costs, on machines without a GPU.
        max_slots: distinct (request, phase) compositions one step may hold (table rows - 1).
        max_clamps: clamp directions per (slot, site); 0 refuses clamps (BatchCapacityError) and,
            in static mode, leaves the clamp passes out of the graph.
        static: CUDA-graph / torch.compile mode (see :mod:`shmsteer.torch_hook`): needs
            ``max_tokens``, ``device``, ``dtype``.
        device: where the hooked tensors live. Without ``static``: a non-CPU device (``"cuda"``)
            picks the eager device path; None or ``"cpu"`` the native CPU path (unless
            ``force_device_path``).
        dtype: static mode's hidden-state dtype (the eager paths take the tensor's).
        max_gate_slots: distinct probe gates (declarative gates) one step may hold.
        max_row_gates: probe gates one request of a step may carry (gate columns per row);
            default 4, and 0 in static mode, where every attached site does the gate columns'
            fixed work in the graph (a step needing more is BatchCapacityError).
        gate_sites: static mode: the (hook, layer) sites whose gate work is in the graph (default:
            every attached site); a step whose gates probe or add elsewhere is BatchCapacityError.
    """

    def __new__(cls, handle: _Handle, force_device_path: bool = False, **kw: Any) -> "SteeringHooks":
        if cls is SteeringHooks:
            if kw.get("static"):
                from ._hooks_static import StaticHooks
                cls = StaticHooks
            elif _wants_device_path(force_device_path, kw.get("device")):
                from ._hooks_device import DeviceHooks
                cls = DeviceHooks
            else:
                from ._hooks_native import NativeHooks
                cls = NativeHooks
        return super().__new__(cls)

    def __init__(self, handle: _Handle, force_device_path: bool = False, *, max_slots: int = 256,
                 max_clamps: int = 4, static: bool = False, max_tokens: int = 0, device: Any = None,
                 dtype: Optional[torch.dtype] = None, max_gate_slots: int = 64,
                 max_row_gates: Optional[int] = None, gate_sites: Optional[Sequence[Tuple[str, int]]] = None) -> None:
        self._handle = handle
        self.hidden, self.layers, _ = handle.model
        if max_row_gates is None:
            max_row_gates = 0 if static else 4
        self.max_row_gates = max_row_gates
        self._batch_opts = (max_slots, max_clamps, max_gate_slots, max_row_gates)
        self._sites: List[int] = []  # attached sites: the batch stages only these
        # A static layout (static mode's buffers before any owner) has no stepper until bind().
        if not getattr(handle, "detached", False):
            self._connect(handle)
        self._packer = SpanPacker()
        self.force_device_path = static or _wants_device_path(force_device_path, device)
        self.max_clamps = max_clamps
        self.max_tokens = max_tokens  #: static mode's largest batch (rows); 0 in the eager modes
        self.static = static
        self._removables: List[Any] = []
        self._capturing = False
        self.checksum = 0  #: determinism checksum of the last step's CPU applies
        self.batch_checksum = 0  #: determinism checksum of what the last step resolved
        self.gate_checksum = 0  #: the gate decisions of the last reported step (Stepper.GateChecksum)
        self.engine_calls = 0  #: calls that resolve, end or report steps (resolve, begin, end, report)

    def _connect(self, handle: _Handle) -> None:
        """Make this hooks' stepper and step batch on ``handle`` (restricted to the attached sites)."""
        self._handle = handle
        self.stepper: Stepper = handle.stepper()
        self.batch = StepBatch(self.stepper, self.hidden, *self._batch_opts)
        if self._sites:
            self.batch.set_sites(self._sites)

    @property
    def uploads(self) -> int:
        """Table rows written to the device so far (a new slot or a changed composition)."""
        return 0

    @property
    def mode(self) -> str:
        """``"native"``, ``"device"`` or ``"static"``."""
        raise NotImplementedError

    # ---- wiring ---------------------------------------------------------------------------

    def site_of(self, hook: str, layer: int) -> int:
        """The site number of (hook, layer): hook_id * layers + layer."""
        hook_id = self._handle.hook_id(hook)
        if not 0 <= layer < self.layers:
            raise LayerRangeError(f"shmsteer: layer {layer}, model has {self.layers}")
        return hook_id * self.layers + layer

    def attach(self, module: torch.nn.Module, hook: str, layer: int, input: bool = False) -> "SiteHandle":
        """Apply (hook, layer) to module's output (its first element when a tuple or list) as
        its forward returns, before the module's forward hooks run; with ``input``, to its first
        input (in place) before its forward. Returns a handle whose ``remove()`` detaches it.
        The sites of one module share one wrapper of its ``forward`` (:class:`SiteHandle`): a
        forward hook would cost the call torch's hook dispatch (about 1.2 µs a module warm and
        6-8 µs in a decode loop, against 0.1 µs), and a compiled graph would not see a hook
        attached after compiling."""
        site = self.site_of(hook, layer)
        self._add_site(site)
        r = SiteHandle(module, self._site_fn(site), input)
        self._removables.append(r)
        return r

    def _add_site(self, site: int) -> None:
        """Attach site (once): the batch stages the attached sites only."""
        if site not in self._sites:
            self._check_new_site()
            self._sites.append(site)
            if self.bound:
                self.batch.set_sites(self._sites)

    @property
    def bound(self) -> bool:
        """Whether the hooks have a stepper (False only for static hooks built on a layout
        before :meth:`~shmsteer._hooks_static.StaticHooks.bind`)."""
        return "batch" in self.__dict__

    def _check_new_site(self) -> None:
        """Refuse a site attached too late (static capture's buffers are sized already)."""

    def _site_fn(self, site: int) -> Callable[[torch.Tensor], None]:
        """What the hook of site does with the hooked tensor."""
        raise NotImplementedError

    def remove(self) -> None:
        """Remove every hook attached by this object."""
        for r in self._removables:
            r.remove()
        self._removables.clear()

    # ---- steps ----------------------------------------------------------------------------

    def step(self, spans: Sequence[SpanLike], version: int = 0, rows: Optional[int] = None) -> ContextManager[Any]:
        """Run one forward pass's hooks with this batch layout, pinned at ``version`` (0: the
        current one; ranks handed the same version apply the same steering). ``rows``: rows of
        the hooked tensors (default: the end of the last span). A context manager: the step
        begins on entry (the hooks are its value) and ends on exit, exception or not."""
        return _Step(self, spans, version, rows)

    def _step_begin(self, spans: Sequence[SpanLike], version: int, rows: Optional[int]) -> None:
        """Begin a step (what entering :meth:`step` does)."""
        raise RuntimeError("shmsteer: static hooks step with prepare(spans), outside the graph")

    def _step_end(self) -> None:
        """End the step :meth:`_step_begin` began (what leaving :meth:`step` does)."""

    def prepare(self, spans: Sequence[SpanLike], version: int = 0) -> int:
        """Static mode only (outside the graph); see :class:`~shmsteer._hooks_static.StaticHooks`."""
        raise RuntimeError("shmsteer: prepare() is for static hooks (SteeringHooks(..., static=True))")

    def report(self) -> None:
        """Static mode: hand the last replayed step's gate scores and captured rows back; a no-op
        in the eager modes (their step does it at its end)."""

    def apply(self, t: torch.Tensor, hook_id: int, layer: int) -> None:
        """Apply (hook, layer) to t in place for the current step's batch."""
        self._site_fn(hook_id * self.layers + layer)(t)

    def _resolve(self, packed: Any, rows: int, version: int, end: bool, reset: bool = False) -> Resolved:
        """The step's one resolving engine call."""
        self.engine_calls += 1
        res = self.batch.resolve(packed, rows, version, end, reset=reset)
        self.batch_checksum = res.checksum
        return res

    def _report(self, scores: Optional[torch.Tensor]) -> None:
        """Hand the step's probe scores ([rows, cols] float32, on any device) back."""
        self.engine_calls += 1
        self.gate_checksum = self.batch.report_tensor(scores)

    # ---- capture --------------------------------------------------------------------------

    def start_capture(self, rank: int = 0, writer_rank: int = 0, ring_bytes: int = 0, wait: float = 0.0,
                      max_rows: int = 0) -> None:
        """Copy the rows admitted requests capture, at every attached site and before steering
        it, into this hooks' capture ring (:meth:`~shmsteer.Stepper.capture_start`: registered
        with the owner's hub; only ``writer_rank`` captures under tensor parallelism). Spans give
        each request's absolute positions as 5-tuples ``(id, start, end, phase,
        first_position)``. Native path: float32 blocks are captured by the apply, bfloat16 and
        float16 blocks from their own bytes first. Device path: per site one gather of the
        planned rows into a device buffer (``torch.ops.shmsteer.capture_``), and at the step's
        end one device-to-host copy, handed to the engine.

        Static mode: call it after attaching every site and before capturing the graphs, whose
        captured forward then writes each site's planned rows into persistent device buffers
        (``max_rows`` rows of the hidden size over all sites per step, default ``max_tokens`` x
        the attached sites); :meth:`report` (or the next :meth:`prepare`), after the replay,
        makes the step's one device-to-host copy and hands each site's rows to the engine. A step
        planning more than ``max_rows`` rows is BatchCapacityError from :meth:`prepare`.

        Raises:
            NoHubError when the owner serves no capture; ValueError in static mode before any
            site is attached or for a negative ``max_rows``.
        """
        self._check_capture_start(max_rows)
        self._check_bound("start_capture")
        self.stepper.capture_start(rank, writer_rank, ring_bytes, wait)
        self._capturing = rank == writer_rank
        if self._capturing:
            self._capture_started(max_rows)

    def _check_bound(self, what: str) -> None:
        """Static hooks on a layout: NotBoundError until bind() (the eager modes are always bound)."""

    def _check_capture_start(self, max_rows: int) -> None:
        """Refuse start_capture's arguments before the ring is made."""

    def _capture_started(self, max_rows: int) -> None:
        """The mode's capture buffers, once this rank captures."""

    def stop_capture(self) -> None:
        """Stop capturing (the ring is closed). In static mode the graphs keep their capture
        work, writing nowhere from the next :meth:`prepare` on."""
        self._check_bound("stop_capture")
        self._capture_stopping()
        self.stepper.capture_stop()
        self._capturing = False

    def _capture_stopping(self) -> None:
        """Hand what the mode still holds of the last step's capture to the engine."""

    def close(self) -> None:
        """Remove the hooks and free the batch and the stepper (after handing a static step's
        last captured rows to the engine)."""
        if not self.bound:
            self.remove()
            return
        self._capture_stopping()
        self.remove()
        self.batch.close()
        self.stepper.close()


__all__ = ["SteeringHooks", "DeviceMismatchError", "ADDEND_BYTES"]
