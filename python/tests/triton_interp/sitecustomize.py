"""Test-only start-up hook (on PYTHONPATH of the vLLM V2 runner tests, tests/test_vllm_v2_e2e.py):
vLLM's CPU build runs its V2 model runner only when Triton has a CPU backend (triton-cpu, which
the package index does not serve); this registers one whose kernels run in Triton's interpreter
(``TRITON_INTERPRET=1``: the same ``@triton.jit`` kernels, executed in Python on CPU tensors), in
every process of the run, before vLLM reads ``triton.backends`` at import. Nothing of shmsteer
uses it."""

import os

os.environ["TRITON_INTERPRET"] = "1"

try:
    from triton.backends import Backend, backends
    from triton.backends.compiler import BaseBackend
    from triton.backends.driver import DriverBase
except ImportError:  # no Triton: vLLM then refuses VLLM_USE_V2_MODEL_RUNNER=1, which the test reports
    pass
else:

    class _InterpreterDriver(DriverBase):
        """A driver vLLM's check sees as active; the interpreter needs none of the rest."""

        @classmethod
        def is_active(cls) -> bool:
            return True

        def get_current_target(self):  # type: ignore[no-untyped-def]
            raise NotImplementedError("kernels run in Triton's interpreter")

        def get_active_torch_device(self):  # type: ignore[no-untyped-def]
            import torch
            return torch.device("cpu")

        def get_benchmarker(self):  # type: ignore[no-untyped-def]
            raise NotImplementedError("kernels run in Triton's interpreter")

        def map_python_to_cpp_type(self, ty):  # type: ignore[no-untyped-def]
            raise NotImplementedError("kernels run in Triton's interpreter")

    backends.setdefault("cpu", Backend(compiler=BaseBackend, driver=_InterpreterDriver))
