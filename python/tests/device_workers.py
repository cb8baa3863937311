"""Worker process bodies for the device-path tests across processes (importable by spawned
children)."""

from __future__ import annotations

from typing import Any, List, Tuple


def device_step(ns: str, secret: bytes, version: int, spans: List[Tuple[str, int, int, str]], warm: bool, q: Any) -> None:
    """Attach, steer one step on the device path at ``version`` (after an unrelated warm-up step
    when ``warm``: other slots assigned first), report the batch checksum and the output."""
    import torch

    import shmsteer
    from shmsteer.torch_hook import SteeringHooks
    from steering_ref import HIDDEN, Chain, attach

    with shmsteer.Client(ns, secret=secret) as c:
        hooks = SteeringHooks(c, force_device_path=True)
        chain = Chain()
        attach(hooks, chain)
        with torch.no_grad():
            if warm:
                with hooks.step([("c", 0, 2, "prefill"), ("b", 2, 3, "prefill")], version=version):
                    chain(torch.zeros(3, HIDDEN))
            x = torch.Generator().manual_seed(5)
            y = torch.randn(12, HIDDEN, generator=x)
            with hooks.step(spans, version=version):
                chain(y)
        q.put((hooks.batch_checksum, y.numpy().tobytes()))
        hooks.close()
