"""Native CPU hooks: the engine's kernels on the hooked tensor's own memory."""

from __future__ import annotations

from typing import Any, Callable, Optional, Sequence

import torch

from ._hooks_base import DeviceMismatchError, SteeringHooks
from ._lib import check, lib
from .client import SpanLike
from .device import CAPTURE_DTYPES, DTYPES, FAST_APPLY, FAST_END, PackedSpans, check_hidden
from .errors import ShapeError


class NativeHooks(SteeringHooks):
    """CPU tensors: per site one library call whose AVX-512/AVX2 kernels add and clamp in place
    (float32 on the tensor's memory; bfloat16 on it too, widened and narrowed inside the
    library; float16 through a float32 copy). Each step is
    one resolve (:attr:`batch_checksum`, the same a device-path step of the same batch gives)
    left open for the applies, and one end (:attr:`checksum`, the applies' determinism
    checksum). A hooked tensor not on the CPU is :class:`DeviceMismatchError`: build the hooks
    with ``device=`` its device for the device path."""

    def __init__(self, handle: Any, force_device_path: bool = False, **kw: Any) -> None:
        super().__init__(handle, force_device_path, **kw)
        self._packed: Optional[PackedSpans] = None  # the open step's spans
        self._rows = 0
        self._fast_apply: Any = FAST_APPLY  # the extension's apply (None: ctypes)
        self.stepper._fast_end = FAST_END  # its end through the extension (None: ctypes)

    @property
    def mode(self) -> str:
        return "native"

    def _step_begin(self, spans: Sequence[SpanLike], version: int, rows: Optional[int]) -> None:
        packed = self._packer.pack(spans)
        n = rows if rows is not None else packed.rows
        # The resolve begins the step (one engine call, the step left open for the applies): the
        # batch checksum of this step, as on the device path, without the device's tables.
        self.engine_calls += 1
        self.batch_checksum = self.batch.resolve_native(packed, n, version)
        self._packed, self._rows = packed, n

    def _step_end(self) -> None:
        self._packed = None
        self.checksum = self.stepper.end()
        self.engine_calls += 1

    def _site_fn(self, site: int) -> Callable[[torch.Tensor], None]:
        # One frame a site for the common case (a contiguous CPU bfloat16 or float32 block of the
        # model's width, inside a step): the hook runs after the model's kernels have evicted
        # the interpreter's lines, so each call and attribute it skips saves a miss. Anything
        # else goes to _apply, which checks and raises the typed errors.
        hook_id, layer = divmod(site, self.layers)
        hidden, slow = self.hidden, self._apply
        bf16, f32 = torch.bfloat16, torch.float32

        def apply(t: torch.Tensor) -> None:
            p = self._packed
            dt = t.dtype
            if p is None or (dt is not bf16 and dt is not f32) or not t.is_cpu or t.dim() == 0 \
                    or t.size(-1) != hidden or not t.is_contiguous():
                slow(t, hook_id, layer)
                return
            n = t.numel()
            if n // hidden < self._rows:
                slow(t, hook_id, layer)
                return
            fast = self._fast_apply
            if fast is not None:
                rc = fast(self.stepper.handle, hook_id, layer, t.data_ptr(), n, p.addr, p.n, dt is bf16)
            else:
                fn = lib.shmsteer_stepper_apply_bf16 if dt is bf16 else lib.shmsteer_stepper_apply
                rc = fn(self.stepper.handle, hook_id, layer, t.data_ptr(), n, p.ptr, p.n)
            if rc:
                check(rc)
        return apply

    def _apply(self, t: torch.Tensor, hook_id: int, layer: int) -> None:
        p = self._packed
        if p is None:
            raise RuntimeError("shmsteer: steering hook ran outside SteeringHooks.step()")
        # Few calls into torch a site (each one misses cache between a model's steps): the
        # typed errors come from check_hidden once something is off.
        dt, hidden = t.dtype, self.hidden
        try:
            width = t.size(-1)
        except IndexError:  # a 0-d tensor
            width = -1
        if width != hidden or dt not in DTYPES or not t.is_contiguous():
            check_hidden(t, hidden)
        if not t.is_cpu:
            raise DeviceMismatchError(f"shmsteer: native CPU hooks got a tensor on {t.device}: build them with "
                                      f"SteeringHooks(handle, device={str(t.device)!r}) for the device path")
        n = t.numel()
        if n // hidden < self._rows:
            raise ShapeError(f"shmsteer: the spans cover {self._rows} rows, the hooked output has {n // hidden}")
        # The stepper is this object's own (one thread at a time, as the hooks are): the kernels
        # run on the tensor's memory; bfloat16 is widened and narrowed inside the library (one
        # call, no copy here); float16 goes through a float32 copy, captured first from its own
        # bytes (the apply of the copy does not capture the site again).
        if dt is torch.float32:
            check(lib.shmsteer_stepper_apply(self.stepper.handle, hook_id, layer, t.data_ptr(), n, p.ptr, p.n))
            return
        if dt is torch.bfloat16:
            check(lib.shmsteer_stepper_apply_bf16(self.stepper.handle, hook_id, layer, t.data_ptr(), n, p.ptr, p.n))
            return
        if self._capturing:
            check(lib.shmsteer_stepper_capture(self.stepper.handle, hook_id, layer, t.data_ptr(),
                                               t.numel() * t.element_size(), CAPTURE_DTYPES[dt], p.ptr, p.n))
        t32 = t.float()
        check(lib.shmsteer_stepper_apply(self.stepper.handle, hook_id, layer, t32.data_ptr(), t32.numel(), p.ptr, p.n))
        t.copy_(t32)


__all__ = ["NativeHooks"]
