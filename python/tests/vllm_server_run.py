"""Helpers for the OpenAI-server end-to-end tests: a tiny random Llama with a small tokenizer made
on the spot, ``vllm serve`` started on loopback in its own process group, ``/health`` waited for,
JSON posted, and the server stopped with its whole group.

By hand (after ``go generate ./capi``; the vLLM environment is ``bash .ci/pyenv-vllm``)::

    PYTHONPATH=python <vllm python> python/tests/vllm_server_run.py /tmp/model-dir

makes the model directory, starts the server, sends one steered and one unsteered completion,
prints both and stops the server.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from typing import Any, Dict, List, Optional, Sequence, Tuple

HERE = os.path.dirname(os.path.abspath(__file__))
VOCAB = 256  # vllm_e2e_run's model: token i is the word "t<i>" (0 <unk>, 1 <s>, 2 </s>)


def make_tokenizer(path: str) -> None:
    """A word-level tokenizer over the model's 256 ids (``t3 t4 ...`` are ids 3, 4, ...):
    tokenizer.json and tokenizer_config.json, as a hub model ships them."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2}
    vocab.update({f"t{i}": i for i in range(3, VOCAB)})
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.save(os.path.join(path, "tokenizer.json"))
    cfg = {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<s>", "eos_token": "</s>",
           "unk_token": "<unk>", "pad_token": "<unk>", "add_bos_token": False, "model_max_length": 512}
    with open(os.path.join(path, "tokenizer_config.json"), "w") as f:
        json.dump(cfg, f)


def make_model_dir(path: str) -> None:
    """vllm_e2e_run's random tiny Llama (hidden 256, 2 layers) plus :func:`make_tokenizer`."""
    sys.path.insert(0, HERE)
    from vllm_e2e_run import make_model
    if not os.path.exists(os.path.join(path, "config.json")):
        make_model(path)
    if not os.path.exists(os.path.join(path, "tokenizer.json")):
        make_tokenizer(path)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


SERVE_FLAGS: Tuple[str, ...] = (
    "--dtype", "float32", "--enforce-eager", "-O0", "--max-model-len", "128", "--max-num-seqs", "8",
    "--max-num-batched-tokens", "32", "--no-enable-prefix-caching", "--seed", "0")
"""The flags the tests serve with (eager: the plugin's hooks are Python; chunked prefill at 32)."""


def start_server(argv: Sequence[str], env: Dict[str, str], log_path: str, cwd: Optional[str] = None) -> subprocess.Popen:
    """Start a server command in its own process group (stop() ends every process vLLM spawned),
    stdout and stderr into log_path."""
    log = open(log_path, "wb")
    try:
        return subprocess.Popen(list(argv), env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                                cwd=cwd)
    finally:
        log.close()


def wait_health(base: str, proc: subprocess.Popen, log_path: str, timeout: float = 900.0) -> None:
    """Wait for GET base/health to answer 200; raise with the log's tail if the server exits
    or the timeout passes."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}:\n{tail(log_path)}")
        try:
            with urllib.request.urlopen(base + "/health", timeout=5) as r:
                if r.status == 200:
                    return
        except (urllib.error.URLError, ConnectionError, OSError):
            pass
        time.sleep(1.0)
    raise RuntimeError(f"server not healthy after {timeout:.0f} s:\n{tail(log_path)}")


def tail(path: str, n: int = 6000) -> str:
    try:
        with open(path, "rb") as f:
            return f.read()[-n:].decode("utf-8", "replace")
    except OSError as e:
        return f"(no log: {e})"


def stop(proc: subprocess.Popen, timeout: float = 30.0) -> int:
    """SIGTERM the server's process group, SIGKILL it after timeout; returns the exit status."""
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=timeout)
    try:  # children left in the group (the engine core) get the same end
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    return int(proc.returncode)


def post(base: str, route: str, body: Dict[str, Any], timeout: float = 300.0) -> Tuple[int, Dict[str, Any]]:
    """POST JSON; returns (HTTP status, decoded JSON answer) for 2xx and error statuses alike."""
    req = urllib.request.Request(base + route, data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"}, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"{}")


def completion(prompt: List[int], max_tokens: int, xargs: Optional[Dict[str, Any]] = None) -> Dict[str, Any]:
    """A greedy /v1/completions body for token ids, returning token ids and their logprobs."""
    body: Dict[str, Any] = {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0.0, "ignore_eos": True,
                            "logprobs": 0, "return_token_ids": True}
    if xargs is not None:
        body["vllm_xargs"] = xargs
    return body


def serve_env(secret: str, namespace: str) -> Dict[str, str]:
    """The server's environment: the plugin on, this checkout's python/ first on the path."""
    env = dict(os.environ, SHMSTEER_VLLM="1", SHMSTEER_SECRET=secret, SHMSTEER_NAMESPACE=namespace,
               VLLM_CPU_KVCACHE_SPACE=os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1"),
               PYTHONPATH=os.path.dirname(HERE) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    env.pop("SHMSTEER_SECRET_FILE", None)
    return env


def vllm_cli_works() -> bool:
    """Whether ``vllm`` finds its own distribution: vLLM's CLI reads ``version("vllm")``, and the
    CPU build from the package index is the distribution ``vllm-cpu``, so there its ``vllm``
    command fails with PackageNotFoundError before parsing any argument."""
    from importlib.metadata import PackageNotFoundError, version
    try:
        version("vllm")
    except PackageNotFoundError:
        return False
    return os.path.exists(os.path.join(os.path.dirname(sys.executable), "vllm"))


SERVE_FALLBACK = "python -m vllm.entrypoints.openai.api_server --model"
"""What replaces ``vllm serve`` where :func:`vllm_cli_works` is False: the same server and flags
(vLLM's deprecated module entry point, which does not read the distribution's version)."""


def serve_argv(model: str, port: int, flags: Sequence[str] = SERVE_FLAGS) -> List[str]:
    """``vllm serve MODEL --host 127.0.0.1 --port PORT flags`` of this interpreter's environment,
    or :data:`SERVE_FALLBACK` where the ``vllm`` command cannot run."""
    if vllm_cli_works():
        head = [os.path.join(os.path.dirname(sys.executable), "vllm"), "serve", model]
    else:
        head = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", model]
    return head + ["--host", "127.0.0.1", "--port", str(port), *flags]


def main() -> None:
    import uuid
    sys.path.insert(0, HERE)
    from vllm_e2e_run import packed, vector
    path = sys.argv[1]
    make_model_dir(path)
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    log = os.path.join(path, "serve.log")
    proc = start_server(serve_argv(path, port),
                        serve_env(uuid.uuid4().hex, "srv-" + uuid.uuid4().hex[:12]), log)
    try:
        wait_health(base, proc, log)
        prompt = [5, 6, 7, 8, 9]
        print(post(base, "/v1/completions", completion(prompt, 8, {"steering_vectors": packed("post_block", 0, vector(0))})))
        print(post(base, "/v1/completions", completion(prompt, 8)))
    finally:
        print("exit", stop(proc))


if __name__ == "__main__":
    main()
