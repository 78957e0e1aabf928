"""Trained checkpoints, one attention layer at a time: a Hugging Face folder (safetensors) or a GGUF file.

``open_checkpoint(path)`` checks the files before it reads any weight (headers bounded, shards present,
offsets inside the file, shapes as the configuration says) and answers a bad file with one
``CheckpointError``. ``Checkpoint.layer(i)`` reads layer ``i``'s attention weights, dequantised, as
float64 attnid parameters (``attnid.layer.parameter_shapes``), so the peak memory is about one layer.
The configuration goes through the same mappers as ``attnid count --config`` (``attnid.hf.config``);
a GGUF file is read by ``attnid.hf.gguf_file`` (its metadata through transformers' table of GGUF keys, its
tensors named and un-permuted by gguf's name map and transformers' tensor processors).
"""

from __future__ import annotations

import json
import re
import struct
from dataclasses import dataclass
from pathlib import Path
from collections.abc import Mapping
from typing import Any, Callable

import torch

from attnid.hf.config import count_config, read_config
from attnid.hf.errors import CheckpointError
from attnid.hf.gguf_file import GGUFSource
from attnid.hf.read import ModelCount
from attnid.layer import parameter_shapes
from attnid.spec import AttentionSpec, Params

MAX_HEADER_BYTES = 100 * 2**20  # safetensors refuses larger headers too
MAX_INDEX_BYTES = 64 * 2**20
SAFETENSORS_DTYPES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1,
                      "BOOL": 1, "F8_E4M3": 1, "F8_E5M2": 1, "U16": 2, "U32": 4, "U64": 8}


@dataclass(frozen=True)
class Naming:
    """Where a model type keeps layer i's attention: module paths with ``{i}``, and how the weights are stored.

    ``fused`` names one Conv1D (y = x W + b, W of shape (d, 3 d)) holding q, k and v (GPT-2);
    otherwise q, k, v, o are nn.Linear modules (y = x W^T + b). ``norm_offset`` is added to a stored
    QK-norm weight (Gemma multiplies by 1 + w).
    """

    q: str
    k: str
    v: str
    o: str
    fused: str = ""
    q_norm: str = ""
    k_norm: str = ""
    norm_offset: float = 0.0


_DECODER = Naming("layers.{i}.self_attn.q_proj", "layers.{i}.self_attn.k_proj", "layers.{i}.self_attn.v_proj",
                  "layers.{i}.self_attn.o_proj", q_norm="layers.{i}.self_attn.q_norm",
                  k_norm="layers.{i}.self_attn.k_norm")
NAMINGS: dict[str, Naming] = {
    "bert": Naming("encoder.layer.{i}.attention.self.query", "encoder.layer.{i}.attention.self.key",
                   "encoder.layer.{i}.attention.self.value", "encoder.layer.{i}.attention.output.dense"),
    "gpt2": Naming("", "", "", "h.{i}.attn.c_proj", fused="h.{i}.attn.c_attn"),
    **{t: _DECODER for t in ("llama", "mistral", "qwen2", "qwen3", "olmo2", "granite", "smollm3", "gemma", "gemma2")},
    "gemma3_text": Naming(**{**_DECODER.__dict__, "norm_offset": 1.0}),
}


def supported_checkpoint_types() -> list[str]:
    """The model types whose checkpoints ``open_checkpoint`` reads."""
    return sorted(NAMINGS)


class _Safetensors:
    """The tensors of one or more .safetensors files, opened lazily, one tensor read at a time."""

    def __init__(self, folder: Path) -> None:
        index = folder / "model.safetensors.index.json"
        single = folder / "model.safetensors"
        if index.is_file():
            files = _shards(index)
        elif single.is_file():
            files = {}
            self.headers = {single: _safetensors_header(single)}
            self.where = {name: single for name in self.headers[single]}
            return
        else:
            raise CheckpointError(f"{folder}: no model.safetensors or model.safetensors.index.json")
        self.headers = {}
        self.where = {}
        for name, shard in files.items():
            path = folder / shard
            if path not in self.headers:
                if not path.is_file():
                    raise CheckpointError(f"{index}: shard {shard} is missing")
                self.headers[path] = _safetensors_header(path)
            if name not in self.headers[path]:
                raise CheckpointError(f"{path}: the index lists {name}, the shard does not hold it")
            self.where[name] = path

    def shape(self, name: str) -> tuple[int, ...] | None:
        path = self.where.get(name)
        return None if path is None else tuple(self.headers[path][name]["shape"])

    def get(self, name: str) -> torch.Tensor:
        from safetensors import safe_open

        try:
            with safe_open(self.where[name], framework="pt") as f:
                return f.get_tensor(name).to(torch.float64)
        except Exception as exc:  # safetensors' own checks (a corrupt file) as one line
            raise CheckpointError(f"{self.where[name]}: cannot read {name} ({exc})") from None


def _shards(index: Path) -> dict[str, str]:
    if index.stat().st_size > MAX_INDEX_BYTES:
        raise CheckpointError(f"{index}: larger than any index ({MAX_INDEX_BYTES} bytes at most)")
    try:
        data = json.loads(index.read_text(encoding="utf-8"))
        weight_map = data["weight_map"]
        if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
            raise TypeError("weight_map is not a mapping of names to files")
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError) as exc:
        raise CheckpointError(f"{index}: not a safetensors index ({exc})") from None
    for shard in set(weight_map.values()):
        if Path(shard).name != shard:
            raise CheckpointError(f"{index}: shard name {shard!r} is not a file name in the folder")
    return weight_map


def _safetensors_header(path: Path) -> dict[str, Any]:
    """The header of a .safetensors file, checked: its length, JSON, dtypes, shapes and offsets inside the file."""
    size = path.stat().st_size
    with path.open("rb") as f:
        head = f.read(8)
        if len(head) < 8:
            raise CheckpointError(f"{path}: truncated ({size} bytes, no header length)")
        (length,) = struct.unpack("<Q", head)
        if length > MAX_HEADER_BYTES or 8 + length > size:
            raise CheckpointError(f"{path}: header of {length} bytes does not fit the file ({size} bytes) "
                                  f"or exceeds {MAX_HEADER_BYTES}")
        raw = f.read(length)
    try:
        header = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CheckpointError(f"{path}: header is not JSON ({exc})") from None
    if not isinstance(header, dict):
        raise CheckpointError(f"{path}: header is not a JSON object")
    header.pop("__metadata__", None)
    data_bytes = size - 8 - length
    for name, entry in header.items():
        try:
            dtype, shape, (start, end) = entry["dtype"], entry["shape"], entry["data_offsets"]
            n = 1
            for s in shape:
                if not isinstance(s, int) or s < 0:
                    raise ValueError("bad shape")
                n *= s
            ok = dtype in SAFETENSORS_DTYPES and 0 <= start <= end <= data_bytes and end - start == n * SAFETENSORS_DTYPES[dtype]
        except (TypeError, KeyError, ValueError):
            ok = False
        if not ok:
            raise CheckpointError(f"{path}: tensor {name} has a bad entry or lies outside the file (truncated?)")
    return header


@dataclass
class Checkpoint:
    """A trained model's attention layers: its configuration, counts and weights, read layer by layer."""

    path: Path
    format: str
    config: dict[str, Any]
    model: ModelCount
    specs: list[AttentionSpec]
    _source: Any
    _naming: Naming
    _prefix: str

    @property
    def n_layers(self) -> int:
        return len(self.specs)

    @property
    def prefix(self) -> str:
        """What the file puts before every module path of ``Naming`` ('' or, e.g., 'model.')."""
        return self._prefix

    def layer(self, i: int, state: Mapping[str, torch.Tensor] | None = None) -> Params:
        """Layer ``i``'s attention parameters (attnid names, float64), checked against its layout.

        ``state``: read the tensors from this mapping instead of the file, under the module paths of ``Naming``
        (a live transformers model's ``state_dict()``, say, while it trains).
        """
        spec, n = self.specs[i], self._naming
        get: Callable[[str], torch.Tensor] = lambda module, suffix="weight": self._tensor(module.format(i=i) + "." + suffix,
                                                                                          state)
        d, h, g, dk, dv = spec.d_model, spec.heads, spec.kv_heads, spec.head_dim, spec.v_head_dim
        if n.fused:
            w, b = get(n.fused), get(n.fused, "bias")
            wq, wk, wv = w[:, :h * dk].T, w[:, h * dk:h * dk + g * dk].T, w[:, h * dk + g * dk:].T
            bq, bk, bv = b[:h * dk], b[h * dk:h * dk + g * dk], b[h * dk + g * dk:]
            wo, bo = get(n.o).T, get(n.o, "bias")
        else:
            wq, wk, wv, wo = get(n.q), get(n.k), get(n.v), get(n.o)
            bq, bk, bv, bo = (get(m, "bias") if spec.has_bias(letter) else None
                              for m, letter in ((n.q, "q"), (n.k, "k"), (n.v, "v"), (n.o, "o")))
        params = {"W_Q": wq.T.reshape(d, h, dk).transpose(0, 1), "W_K": wk.T.reshape(d, g, dk).transpose(0, 1),
                  "W_V": wv.T.reshape(d, g, dv).transpose(0, 1), "W_O": wo.T.reshape(h, dv, d)}
        for name, bias, heads in (("b_Q", bq, h), ("b_K", bk, g), ("b_V", bv, g)):
            if spec.has_bias(name[-1].lower()):
                params[name] = bias.reshape(heads, -1)
        if spec.has_bias("o"):
            params["b_O"] = bo
        if "q_norm" in parameter_shapes(spec):
            for name, module in (("q_norm", n.q_norm), ("k_norm", n.k_norm)):
                params[name] = get(module).reshape(parameter_shapes(spec)[name]) + n.norm_offset
        for name, t in params.items():
            if not torch.isfinite(t).all():
                raise CheckpointError(f"{self.path}: layer {i}: {name} holds NaN or inf")
        return params

    def tensors(self, i: int, params: Params) -> dict[str, torch.Tensor]:
        """The inverse of ``layer``: layer ``i``'s attention tensors under the checkpoint's names (float64)."""
        spec, n, at = self.specs[i], self._naming, lambda m, suffix="weight": f"{self._prefix}{m.format(i=i)}.{suffix}"
        d = spec.d_model
        lin = {letter: params[f"W_{letter.upper()}"].transpose(0, 1).reshape(d, -1).T for letter in "qkv"}
        wo = params["W_O"].reshape(-1, d).T
        bias = {letter: params[f"b_{letter.upper()}"].reshape(-1) for letter in "qkv" if spec.has_bias(letter)}
        if n.fused:
            out = {at(n.fused): torch.cat([lin[c].T for c in "qkv"], dim=1),
                   at(n.fused, "bias"): torch.cat([bias[c] for c in "qkv"]), at(n.o): wo.T, at(n.o, "bias"): params["b_O"]}
        else:
            out = {at(getattr(n, c)): lin[c] for c in "qkv"} | {at(n.o): wo}
            out |= {at(getattr(n, c), "bias"): b for c, b in bias.items()}
            if spec.has_bias("o"):
                out[at(n.o, "bias")] = params["b_O"]
        if "q_norm" in params:
            out |= {at(n.q_norm): params["q_norm"].reshape(-1) - n.norm_offset,
                    at(n.k_norm): params["k_norm"].reshape(-1) - n.norm_offset}
        return out

    def all_tensors(self) -> dict[str, torch.Tensor]:
        """Every tensor of a safetensors checkpoint, in its stored dtype (the whole model in memory)."""
        from safetensors import safe_open

        state = {}
        for path in self._source.headers:
            with safe_open(path, framework="pt") as f:
                state.update({name: f.get_tensor(name) for name in f.keys()})
        return state

    def _tensor(self, name: str, state: Mapping[str, torch.Tensor] | None = None) -> torch.Tensor:
        if state is not None:
            if name not in state:
                raise CheckpointError(f"{self.path}: tensor {name} is missing from the state given")
            return state[name].detach().to("cpu", torch.float64)
        full = self._prefix + name
        if self._source.shape(full) is None:
            raise CheckpointError(f"{self.path}: tensor {full} is missing")
        return self._source.get(full)


def open_checkpoint(path: Path | str) -> Checkpoint:
    """A checkpoint folder (config.json and safetensors) or a .gguf file, checked; no weight is read yet."""
    path = Path(path)
    if not path.exists():
        raise CheckpointError(f"{path}: no such file or folder")
    if path.is_dir():
        try:
            config, where = read_config(path)
        except ValueError as exc:
            raise CheckpointError(str(exc)) from None
        source: Any = _Safetensors(path)
        fmt = "safetensors"
    elif path.is_file():
        source = GGUFSource(path)
        config, where, fmt = source.config(), str(path), "gguf"
    else:
        raise CheckpointError(f"{path}: neither a folder nor a file")
    model_type = config.get("model_type")
    if model_type not in NAMINGS:
        raise CheckpointError(f"{where}: model_type {model_type!r}: checkpoints of this type are not read yet "
                              f"(supported: {', '.join(supported_checkpoint_types())})")
    try:
        model = count_config(config, where)
    except ValueError as exc:
        raise CheckpointError(str(exc)) from None
    if fmt == "gguf":
        source.bind(config)
    specs = _layer_specs(model, config, where)
    naming = NAMINGS[model_type]
    checkpoint = Checkpoint(path, fmt, config, model, specs, source, naming, _prefix(source, naming, fmt, where))
    _check_shapes(checkpoint)
    return checkpoint


def _layer_specs(model: ModelCount, config: dict[str, Any], where: str) -> list[AttentionSpec]:
    counted = model.counted
    if len(model.groups) != len(counted) or not counted:
        raise CheckpointError(f"{where}: some layers are not attention layers this tool counts")
    if len(counted) == 1:
        return [counted[0].spec] * counted[0].layers
    kinds = config.get("layer_types")
    by_kind = {g.kind: g.spec for g in counted}
    if not isinstance(kinds, list) or len(kinds) != model.layers or not set(kinds) <= set(by_kind):
        raise CheckpointError(f"{where}: layers of kinds {sorted(by_kind)}, and no layer_types list says which is which")
    return [by_kind[k] for k in kinds]


def _prefix(source: Any, naming: Naming, fmt: str, where: str) -> str:
    if fmt == "gguf":
        return ""
    probe = (naming.fused or naming.q).format(i=0) + ".weight"
    found = sorted(name[: -len(probe)] for name in source.where if name.endswith(probe)
                   and re.fullmatch(r"([A-Za-z_][\w]*\.)*", name[: -len(probe)]))
    if not found:
        raise CheckpointError(f"{where}: the weights hold no {probe} (not a checkpoint of this model type?)")
    return min(found, key=len)


def _check_shapes(checkpoint: Checkpoint) -> None:
    """Every attention tensor of every layer exists with the shape the configuration implies."""
    for i, spec in enumerate(checkpoint.specs):
        d, h, g, dk, dv = spec.d_model, spec.heads, spec.kv_heads, spec.head_dim, spec.v_head_dim
        n = checkpoint._naming
        want: dict[str, tuple[int, ...]] = {}
        if n.fused:
            want[n.fused.format(i=i) + ".weight"] = (d, h * dk + g * dk + g * dv)
            want[n.o.format(i=i) + ".weight"] = (h * dv, d)
        else:
            for module, shape, letter in ((n.q, (h * dk, d), "q"), (n.k, (g * dk, d), "k"), (n.v, (g * dv, d), "v"),
                                          (n.o, (d, h * dv), "o")):
                want[module.format(i=i) + ".weight"] = shape
                if spec.has_bias(letter):
                    want[module.format(i=i) + ".bias"] = shape[:1]
        for name, shape in want.items():
            got = checkpoint._source.shape(checkpoint._prefix + name)
            if got is None:
                raise CheckpointError(f"{checkpoint.path}: tensor {checkpoint._prefix + name} is missing")
            if tuple(got) != shape:
                raise CheckpointError(f"{checkpoint.path}: {checkpoint._prefix + name} has shape {tuple(got)}, the "
                                      f"configuration implies {shape}")
