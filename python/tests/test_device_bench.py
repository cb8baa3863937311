"""The device-path benchmark runs (one round of one step): its contenders agree with the plain
torch gather-add (the script checks every output against it before timing) and the engine calls
per step are what the goals say. No timing is checked here."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("torch", reason="torch not importable (apt-get install python3-torch)")

SCRIPT = os.path.join(os.path.dirname(__file__), "..", "benchmarks", "device_step.py")


def test_device_bench_runs_and_counts_calls():
    out = subprocess.run([sys.executable, SCRIPT, "--rounds", "1", "--steps", "2", "--json"],
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr
    r = json.loads(out.stdout)
    assert {"baseline", "native", "device", "static"} <= set(r["ms_per_step_median"])
    calls = r["engine_calls_per_step"]
    assert calls["device"] == 1 and calls["static"] == 1 and calls["native"] == 2
    assert r["kernel_calls_per_step"]["native"] == 32
