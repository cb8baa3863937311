"""One step's spans from a vLLM model runner's batch.

A vLLM step runs one forward pass over the flattened tokens of every scheduled request: request
``i`` of the batch owns rows ``query_start_loc[i]:query_start_loc[i+1]`` of every hidden state,
its first row at absolute position ``num_computed_tokens[i]``; rows past ``query_start_loc[n]``
are padding (a CUDA-graph batch is padded up to a captured size) and belong to no request.

:func:`build_spans` turns those arrays into shmsteer spans ``(request id, start, end, phase,
first_position)``. A row is ``prefill`` while its position is inside the prompt and ``decode``
after it, so a chunk of a chunked prefill is prefill, a decode step's row (the last sampled
token) is decode, and a chunk that recomputes a preempted request's prompt *and* its generated
tokens is split at the prompt's end (the generated tokens were first computed as decode rows,
and a recompute must steer them the same way).

:func:`spans_from_v1` reads the arrays of the V1 ``GPUModelRunner`` (and ``CPUModelRunner``, its
subclass) after ``_prepare_inputs``; :func:`spans_from_v2` reads the ``InputBatch`` the V2 runner's
``prepare_inputs`` returns. Both are resolved once per step, outside the forward pass.
"""

from __future__ import annotations

from typing import Any, List, Sequence, Tuple

import numpy as np

from .errors import BatchLayoutError

__all__ = ["Span", "build_spans", "spans_from_v1", "spans_from_v2"]

Span = Tuple[str, int, int, str, int]
"""(request id, start row, end row, phase, first absolute position)."""


def build_spans(req_ids: Sequence[str], query_start_loc: Any, num_computed: Any, prompt_lens: Any,
                rows: int) -> List[Span]:
    """Spans of one step's rows.

    Args:
        req_ids: the batch's request ids, in batch order (the id the worker sees: vLLM's internal
            request id).
        query_start_loc: ``len(req_ids) + 1`` cumulative row offsets (entries past that ignored).
        num_computed: per request, tokens already computed before this step (its first row's
            absolute position).
        prompt_lens: per request, the prompt's length in tokens.
        rows: rows of the hidden states this step (padding included): every span must end
            within it.

    Returns:
        One span per request with rows, two when its rows cross the prompt's end; requests with
        no rows this step give none.

    Raises:
        BatchLayoutError: the arrays disagree (lengths, decreasing offsets, rows past ``rows``).
    """
    n = len(req_ids)
    qsl = np.asarray(query_start_loc, dtype=np.int64)
    comp = np.asarray(num_computed, dtype=np.int64)
    plen = np.asarray(prompt_lens, dtype=np.int64)
    if qsl.shape[0] < n + 1 or comp.shape[0] < n or plen.shape[0] < n:
        raise BatchLayoutError(f"shmsteer.vllm: {n} requests but query_start_loc has {qsl.shape[0]} entries, "
                               f"num_computed {comp.shape[0]}, prompt_lens {plen.shape[0]}")
    if n and (qsl[0] != 0 or np.any(np.diff(qsl[: n + 1]) < 0)):
        raise BatchLayoutError(f"shmsteer.vllm: query_start_loc {qsl[: n + 1].tolist()} is not a cumulative offset")
    if n and qsl[n] > rows:
        raise BatchLayoutError(f"shmsteer.vllm: the batch's {int(qsl[n])} rows exceed the {rows} rows of the step")
    out: List[Span] = []
    for i, rid in enumerate(req_ids):
        start, end, pos, plen_i = int(qsl[i]), int(qsl[i + 1]), int(comp[i]), int(plen[i])
        if end == start:
            continue
        if pos < 0:
            raise BatchLayoutError(f"shmsteer.vllm: request {rid!r}: {pos} computed tokens")
        cut = start + max(0, min(end - start, plen_i - pos))  # rows before the cut are prompt rows
        if cut > start:
            out.append((rid, start, cut, "prefill", pos))
        if end > cut:
            out.append((rid, cut, end, "decode", pos + (cut - start)))
    return out


def spans_from_v1(runner: Any, rows: int) -> List[Span]:
    """The spans of the step a V1 runner (``vllm.v1.worker.gpu_model_runner.GPUModelRunner`` or
    a subclass) has prepared: its ``input_batch`` (request order, computed tokens, prompt
    lengths) and ``query_start_loc`` (CPU numpy side), read after ``_prepare_inputs``."""
    ib = runner.input_batch
    n = ib.num_reqs
    return build_spans(ib.req_ids[:n], runner.query_start_loc.np[: n + 1], ib.num_computed_tokens_cpu[:n],
                       ib.num_prompt_tokens[:n], rows)


def spans_from_v2(batch: Any) -> Tuple[List[Span], int]:
    """(spans, rows) of a V2 runner's ``vllm.v1.worker.gpu.input_batch.InputBatch``: the rows are
    ``num_tokens_after_padding``, the prompt's end ``prefill_len_np``."""
    n = batch.num_reqs
    rows = int(batch.num_tokens_after_padding)
    return build_spans(batch.req_ids[:n], batch.query_start_loc_np[: n + 1], batch.num_computed_tokens_np[:n],
                       batch.prefill_len_np[:n], rows), rows
