"""The serving-loop benchmark runs (one round of a short schedule): every steered contender gives
the plain table hook's output (the script checks that before timing) and the report carries every
figure the goals name. No timing is checked here."""

from __future__ import annotations

import json
import os
import subprocess
import sys

SCRIPT = os.path.join(os.path.dirname(__file__), "..", "benchmarks", "decode_loop.py")


def test_decode_loop_bench_runs() -> None:
    out = subprocess.run([sys.executable, SCRIPT, "--rounds", "1", "--requests", "4", "--concurrency", "2",
                          "--admissions", "1", "--json"], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr
    r = json.loads(out.stdout)
    assert set(r["loop"]) == {"float32", "bfloat16"}
    assert {"table", "native", "device", "static", "device_gated"} <= set(r["loop"]["float32"]["ratio"])
    assert {"table", "device", "static", "device_gated"} <= set(r["loop"]["bfloat16"]["ratio"])
    assert r["loop"]["float32"]["ratio"]["device_gated"]["against"] == "device"
    assert set(r["admit_ms"]) == {"inline", "named", "none"}
    assert r["shape"]["decode_steps"] > 0
