"""The vLLM plugin's V2 model runner wrapping (``patch_v2_runner``) on a stand-in runner class
with the V2 contract (no vLLM): ``execute_model`` calls ``prepare_inputs(scheduler_output, ...)``,
which returns an ``InputBatch``, then the model's forward. The wrapped runner steers the batch's
spans at the version the scheduler handed it (``scheduler_output.shmsteer_version``), as the V1
runner's wrapping does."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import torch

import shmsteer
from shmsteer.vllm import static as vstatic
from shmsteer.vllm.worker import WorkerSteering, patch_v2_runner

from test_vllm_plugin import HIDDEN, _Model
from test_vllm_static import LAYERS, SPANS, _Follower, admit, config


class _V2Runner:
    """The V2 runner's contract the plugin wraps (vllm.v1.worker.gpu.model_runner)."""

    def __init__(self, model: Any, steering: WorkerSteering, batch: Any) -> None:
        self.model, self.vllm_config, self._shmsteer, self.batch = model, steering.vllm_config, steering, batch
        self.x = torch.zeros(0)
        self.out = torch.zeros(0)

    def get_model(self) -> Any:
        return self.model

    def prepare_inputs(self, scheduler_output: Any, batch_req_state: Any, batch_desc: Any,
                       num_active_loras: int) -> Any:
        return self.batch

    def execute_model(self, scheduler_output: Any, intermediate_tensors: Any = None) -> None:
        self.prepare_inputs(scheduler_output, None, None, 0)
        with torch.no_grad():
            self.out = self.model(self.x.clone())  # static mode: as a graph replay (its sites steer)


patch_v2_runner(_V2Runner)

# SPANS as vLLM's V2 InputBatch carries them: "a" prefills rows 0-1, "b" decodes row 2 at
# position 5, "u" prefills row 3; rows 4 and 5 pad the batch.
BATCH = SimpleNamespace(num_reqs=3, num_tokens_after_padding=6, req_ids=["a", "b", "u"],
                        query_start_loc_np=np.array([0, 2, 3, 4]), num_computed_tokens_np=np.array([0, 5, 0]),
                        prefill_len_np=np.array([2, 5, 1]))


@pytest.mark.parametrize("static", [False, True], ids=["eager", "static"])
def test_v2_runner_steers_at_the_schedulers_version(ns, secret, monkeypatch, static):
    """Eager (the model's forward hooks open and close the step) and static mode (prepare_inputs
    prepares, execute_model reports): the same output as the V1 path's ``run``, at the version
    the scheduler output carries."""
    monkeypatch.delenv("SHMSTEER_VLLM_HOOKS", raising=False)
    monkeypatch.delenv("SHMSTEER_VLLM_STATIC_CAPTURE", raising=False)
    torch.manual_seed(0)
    m_v2, m_ref = _Model(LAYERS), _Model(LAYERS)
    m_ref.load_state_dict(m_v2.state_dict())
    x = torch.randn(6, HIDDEN, generator=torch.Generator().manual_seed(3))
    monkeypatch.setenv("SHMSTEER_VLLM_STATIC", "1" if static else "0")
    built = vstatic.build(m_v2, config(), compiled=False) if static else (None, None)
    with shmsteer.Owner(ns, secret=secret, hidden=HIDDEN, layers=LAYERS) as o:
        admit(o, 1.0)
        v2 = _V2Runner(m_v2, WorkerSteering(m_v2, config(), follower=_Follower(o), sites=built[1], static=built[0]),
                       BATCH)
        monkeypatch.setenv("SHMSTEER_VLLM_STATIC", "0")
        ref = WorkerSteering(m_ref, config(), follower=_Follower(o))
        v2.x = x
        with torch.no_grad():
            want = ref.run(SPANS, 6, lambda: m_ref(x.clone()))
        v2.execute_model(SimpleNamespace())  # no version: the current one
        torch.testing.assert_close(v2.out, want)
        assert v2._shmsteer.steps == 1 and v2._shmsteer.version == 0 and v2._shmsteer._open is None
        cur = o.version
        v2.execute_model(SimpleNamespace(shmsteer_version=cur))
        torch.testing.assert_close(v2.out, want)
        assert v2._shmsteer.version == cur
        # A version the owner never wrote reaches the engine, which refuses it: the step is
        # closed and the error raised, as a failed forward's.
        with pytest.raises(shmsteer.errors.ShmsteerError):
            v2.execute_model(SimpleNamespace(shmsteer_version=cur + 1000))
        assert v2._shmsteer._open is None and v2._shmsteer.version == cur + 1000
        assert not torch.equal(want, m_ref(x.clone())), "the steps steered"
        ref.shutdown()
        v2._shmsteer.shutdown()
