"""A NumPy reader of the filesystem consumer's layout, written from the fork's documented
format (docs/features/capture_consumers.md, the reference reader's docstring): read_request
auto-detects packed (a packed*.json index) or per_file ({layer}_{hook}.bin + .json), decodes
each (layer, hook) with np.frombuffer(...).reshape(shape), bf16 as uint16 (and, with torch,
viewed back as torch.bfloat16). Prints {"layer_hook": {dtype, shape, sha256, positions}}."""

import hashlib
import json
import pathlib
import sys

import numpy as np

NP = {"float32": "float32", "float16": "float16", "bfloat16": "uint16"}


def decode(buf: bytes, shape: list, dtype: str) -> np.ndarray:
    """One tensor's bytes as an array of its sidecar's shape (bf16 as uint16)."""
    return np.frombuffer(buf, dtype=np.dtype(NP[dtype])).reshape(shape)


def read_request(d: pathlib.Path) -> dict:
    """{(layer, hook): (array, dtype, positions)} of a request directory, either layout."""
    out = {}
    indexes = sorted(d.glob("packed*.json"))
    if indexes:
        for ip in indexes:
            index = json.loads(ip.read_text())
            assert index["layout"] == "packed"
            raw = ip.with_suffix(".bin").read_bytes()
            parts = {}
            for e in index["entries"]:
                chunk = raw[e["offset"] : e["offset"] + e["nbytes"]]
                assert len(chunk) == e["nbytes"], "packed bin truncated"
                dt = e.get("dtype", index["dtype"])
                parts.setdefault((e["layer"], e["hook"]), []).append(
                    (e["offset"], decode(chunk, e["shape"], dt), e.get("positions"), dt)
                )
            for key, ps in parts.items():
                ps.sort(key=lambda p: p[0])
                arr = np.concatenate([p[1] for p in ps], axis=0)
                pos = [x for p in ps for x in p[2]]
                out[key] = (arr, ps[0][3], pos)
        return out
    for b in sorted(d.glob("*.bin")):
        if b.name.startswith("packed"):
            continue
        side = json.loads(b.with_suffix(".json").read_text())
        arr = decode(b.read_bytes(), side["shape"], side["dtype"])
        out[(side["layer"], side["hook"])] = (arr, side["dtype"], side["positions"])
    return out


def main() -> None:
    """Read sys.argv[1] and print each site's dtype, shape, digest and positions as JSON."""
    res = {}
    for (layer, hook), (arr, dtype, pos) in read_request(pathlib.Path(sys.argv[1])).items():
        if dtype == "bfloat16":
            try:
                import torch

                # The fork's torch.from_numpy(arr).view(torch.bfloat16); torch builds without
                # numpy uint16 take the same bits as int16.
                t = torch.from_numpy(arr.view(np.int16).copy()).view(torch.bfloat16)
                assert t.dtype == torch.bfloat16 and tuple(t.shape) == arr.shape
                arr = t.view(torch.int16).numpy().view(np.uint16)
            except ImportError:
                pass
        res[f"{layer}_{hook}"] = {
            "dtype": dtype,
            "shape": list(arr.shape),
            "sha256": hashlib.sha256(arr.tobytes()).hexdigest(),
            "positions": pos,
        }
    json.dump(res, sys.stdout)


main()
