"""Gate counts from worker processes reach a real ``shmsteer serve``'s status and metrics: two
Python workers (the C ABI's device path and shmsteer_stepper_report_gates) step a gated request
and report; /v1/status and /metrics sum them."""

from __future__ import annotations

import base64
import json
import urllib.request

import numpy as np
import pytest

pytest.importorskip("torch", reason="torch not importable (apt-get install python3-torch)")

import workers  # noqa: E402
from test_follower import API_KEY, HIDDEN, Serve, serve_bin  # noqa: E402,F401


def _packed(layer: int, i: int) -> dict:
    v = np.zeros((1, HIDDEN), np.float32)
    v[0, i] = 1
    return {"dtype": "float32", "shape": [1, HIDDEN], "layer_indices": [layer], "data": base64.b64encode(v.tobytes()).decode()}


def _get(s: Serve, path: str) -> bytes:
    req = urllib.request.Request(s.addr + path, headers={"Authorization": "Bearer " + API_KEY})
    with urllib.request.urlopen(req, timeout=10) as r:
        return r.read()


def test_worker_gate_counts_reach_serve(serve_bin, ns, secret, tmp_path, spawn):  # noqa: F811
    keys = tmp_path / "keys"
    keys.write_text(API_KEY + "\n")
    keys.chmod(0o600)
    s = Serve(serve_bin, ns, secret, str(tmp_path / "state"), str(keys))
    try:
        s.post("/v1/steering/vectors/register", {"name": "p", "kind": "probe", "packed": {"post_block": _packed(0, 0)}})
        s.post("/v1/steering/vectors/register", {"name": "s", "kind": "steer", "packed": {"post_block": _packed(1, 1)}})
        probe = {"kind": "probe", "probe": {"kind": "name", "name": "p"}, "threshold": 0.5, "sharpness": 100}
        add = {"kind": "add", "steer": {"kind": "name", "name": "s"}}
        s.post("/v1/requests/admit", {"request_id": "r1", "steering": [{"when": probe, "scope": "this_token", "apply": add},
                                                                      {"when": probe, "scope": "next_step", "apply": add}]})
        q = spawn.Queue()
        procs = [spawn.Process(target=workers.gated_device_worker, args=(ns, secret, f"rank{i}", q)) for i in range(2)]
        for p in procs:
            p.start()
        stats = [q.get(timeout=60) for _ in procs]
        for p in procs:
            p.join(timeout=30)
        for st in stats:
            assert isinstance(st, dict), st
            assert st["gate_scopes"]["this_token"] == {"evaluations": 3, "fires": 3, "engaged": 0}
            assert st["gate_scopes"]["next_step"] == {"evaluations": 3, "fires": 3, "engaged": 3}
        gw = json.loads(_get(s, "/v1/status"))["gate_work"]
        assert gw["workers"] == 2
        assert gw["evaluations"]["this_token"] == 6 and gw["fires"]["next_step"] == 6 and gw["engaged"]["next_step"] == 6
        assert gw["engaged"]["this_token"] == 0 and gw["reports_missed"] == 0
        metrics = _get(s, "/metrics").decode()
        assert 'shmsteer_gate_evaluations_total{scope="this_token"} 6' in metrics
        assert 'shmsteer_gate_engaged_total{scope="next_step"} 6' in metrics
    finally:
        s.kill()
