"""A GGUF file's metadata and tensors, read lazily and within bounds: the index first, one tensor at a time.

``gguf.GGUFReader`` builds a Python object for every element of every metadata array, so the tokenizer's
vocabulary alone costs a GGUF of SmolLM2's size about 150 MB before any weight is read. This reader walks
the header once (GGUF versions 2 and 3), keeps the scalar fields and short arrays, steps over long arrays
(the vocabulary, the merges) without building them, and records each tensor's shape, type and offset.
A tensor's bytes are then a view of the memory-mapped file, dequantised by ``gguf.quants.dequantize``.
The configuration comes from transformers' own table of GGUF keys (``GGUF_TO_TRANSFORMERS_MAPPING``),
the tensor names from gguf's name map, and the Q/K un-permutation from transformers' tensor processors,
so the weights are those ``from_pretrained(..., gguf_file=...)`` loads (the tests compare them).
Every length and offset is checked against the file's size: a truncated or corrupt file is one
``CheckpointError``, never a large allocation.
"""

from __future__ import annotations

import mmap
import struct
from pathlib import Path
from typing import Any

import numpy as np
import torch

from attnid.hf.errors import CheckpointError

MAGIC = b"GGUF"
VERSIONS = (2, 3)
KEPT_ARRAY = 4096  # arrays longer than this (a vocabulary, merges) are stepped over, not built
SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
STRING, ARRAY = 8, 9
DEFAULT_ALIGNMENT = 32
FLOAT_TYPES = {0: np.float32, 1: np.float16, 28: np.float64}  # GGML F32, F16, F64: stored as they are
# model_type names transformers gives some GGUF architectures (its load_gguf_checkpoint renames them)
RENAMED = {"gemma3": "gemma3_text", "qwen2moe": "qwen2_moe", "qwen3moe": "qwen3_moe"}


class _Cursor:
    """Reads little-endian values from the mapped file, refusing to read past its end."""

    def __init__(self, data: mmap.mmap, path: Path) -> None:
        self.data, self.path, self.at = data, path, 0

    def take(self, fmt: str) -> Any:
        size = struct.calcsize(fmt)
        if self.at + size > len(self.data):
            raise CheckpointError(f"{self.path}: the GGUF file is truncated (its header runs past {len(self.data)} bytes)")
        (value,) = struct.unpack_from(fmt, self.data, self.at)
        self.at += size
        return value

    def string(self) -> str:
        n = self.take("<Q")
        if self.at + n > len(self.data):
            raise CheckpointError(f"{self.path}: the GGUF file is truncated (a string of {n} bytes runs past its end)")
        raw = bytes(self.data[self.at:self.at + n])
        self.at += n
        return raw.decode("utf-8", errors="replace")

    def value(self, kind: int, keep: bool = True) -> Any:
        if kind in SCALARS:
            return self.take(SCALARS[kind])
        if kind == STRING:
            return self.string()
        if kind == ARRAY:
            item, n = self.take("<I"), self.take("<Q")
            if item == ARRAY or (item not in SCALARS and item != STRING):
                raise CheckpointError(f"{self.path}: a GGUF array of unknown item type {item}")
            build = keep and n <= KEPT_ARRAY
            if item in SCALARS and not build:  # fixed-size items: jump over them
                size = n * struct.calcsize(SCALARS[item])
                if self.at + size > len(self.data):
                    raise CheckpointError(f"{self.path}: the GGUF file is truncated (an array runs past its end)")
                self.at += size
                return None
            values = [self.value(item, build) for _ in range(n)]
            return values if build else None
        raise CheckpointError(f"{self.path}: a GGUF field of unknown type {kind}")


class GGUFFile:
    """A GGUF file's fields and tensor index (``read`` once), and its tensors on demand (``tensor``)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        with path.open("rb") as f:
            head = f.read(24)
            if len(head) < 24 or head[:4] != MAGIC:
                raise CheckpointError(f"{path}: not a GGUF file (no GGUF magic)")
            version, n_tensors, n_fields = struct.unpack("<IQQ", head[4:24])
            if version not in VERSIONS:
                raise CheckpointError(f"{path}: GGUF version {version} is not supported (2 or 3)")
            size = path.stat().st_size
            if n_tensors * 24 + n_fields * 12 > size:  # each entry takes at least this many bytes
                raise CheckpointError(f"{path}: its header announces {n_tensors} tensors and {n_fields} fields, "
                                      f"more than {size} bytes can hold (truncated or corrupt)")
            self.data = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        cursor = _Cursor(self.data, path)
        cursor.at = 24
        self.fields: dict[str, Any] = {}
        for _ in range(n_fields):
            key = cursor.string()
            self.fields[key] = cursor.value(cursor.take("<I"))
        self.tensors: dict[str, tuple[tuple[int, ...], int, int]] = {}
        for _ in range(n_tensors):
            name = cursor.string()
            dims = tuple(cursor.take("<Q") for _ in range(cursor.take("<I")))
            self.tensors[name] = (dims, cursor.take("<I"), cursor.take("<Q"))
        alignment = self.fields.get("general.alignment", DEFAULT_ALIGNMENT)
        if not isinstance(alignment, int) or alignment <= 0:
            raise CheckpointError(f"{path}: general.alignment {alignment!r} is not a positive integer")
        self.start = -(-cursor.at // alignment) * alignment
        for name in self.tensors:
            self._extent(name)  # every tensor lies inside the file

    def _extent(self, name: str) -> tuple[int, int]:
        """(first byte, byte count) of a tensor's data."""
        from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

        dims, kind, offset = self.tensors[name]
        try:
            block, type_size = GGML_QUANT_SIZES[GGMLQuantizationType(kind)]
        except (ValueError, KeyError):
            raise CheckpointError(f"{self.path}: tensor {name} has an unknown GGML type {kind}") from None
        n = int(np.prod(dims, dtype=np.int64)) if dims else 1
        if n % block:
            raise CheckpointError(f"{self.path}: tensor {name} has {n} elements, not a whole number of blocks")
        count = n // block * type_size
        first = self.start + offset
        if first + count > len(self.data):
            raise CheckpointError(f"{self.path}: tensor {name} lies outside the file (truncated?)")
        return first, count

    def shape(self, name: str) -> tuple[int, ...]:
        """The tensor's shape in PyTorch order (GGUF lists the fastest-varying dimension first)."""
        return tuple(int(s) for s in reversed(self.tensors[name][0]))

    def tensor(self, name: str) -> np.ndarray:
        """The tensor's values as float32 (dequantised), in PyTorch order."""
        from gguf import GGMLQuantizationType
        from gguf.quants import dequantize

        first, count = self._extent(name)
        raw = np.frombuffer(self.data, dtype=np.uint8, count=count, offset=first)
        kind = self.tensors[name][1]
        if kind in FLOAT_TYPES:
            values = raw.view(FLOAT_TYPES[kind]).astype(np.float32)
        else:
            values = dequantize(raw, GGMLQuantizationType(kind))
        return values.reshape(self.shape(name))

    def config(self) -> dict[str, Any]:
        """A Hugging Face configuration dict, from transformers' table of GGUF keys (tokenizer fields left out)."""
        from transformers.integrations.ggml import GGUF_CONFIG_DEFAULTS_MAPPING
        from transformers.modeling_gguf_pytorch_utils import GGUF_TO_TRANSFORMERS_MAPPING

        table = GGUF_TO_TRANSFORMERS_MAPPING["config"]
        architecture = self.fields.get("general.architecture")
        if not isinstance(architecture, str) or architecture not in table:
            raise CheckpointError(f"{self.path}: GGUF architecture {architecture!r} is not one transformers reads")
        config: dict[str, Any] = {}
        for key, value in self.fields.items():
            prefix, _, rest = key.partition(".")
            renamed = table.get(prefix, {}).get(rest) if prefix in (architecture, "general") else None
            if renamed not in (None, -1) and value is not None:
                config[renamed] = value
        config["model_type"] = RENAMED.get(architecture, architecture)
        for key, value in GGUF_CONFIG_DEFAULTS_MAPPING.get(architecture, {}).items():
            config.setdefault(key, value)
        config["tie_word_embeddings"] = "output.weight" not in self.tensors
        return config


class GGUFSource:
    """The attention tensors of a GGUF file under transformers' Hugging Face names, un-permuted as it loads them."""

    def __init__(self, path: Path) -> None:
        self.file = GGUFFile(path)
        self.path = path

    def config(self) -> dict[str, Any]:
        return self.file.config()

    def bind(self, config: dict[str, Any]) -> None:
        """Name map and tensor processor for this model type (gguf's and transformers' own)."""
        from gguf import MODEL_ARCH_NAMES, get_tensor_name_map
        from transformers.modeling_gguf_pytorch_utils import TENSOR_PROCESSORS, TensorProcessor

        arch_name = {v: k for k, v in RENAMED.items()}.get(config["model_type"], config["model_type"])
        arch = next((k for k, v in MODEL_ARCH_NAMES.items() if v == arch_name), None)
        if arch is None:
            raise CheckpointError(f"{self.path}: gguf has no tensor names for architecture {arch_name!r}")
        self.names = get_tensor_name_map(arch, int(config["num_hidden_layers"]))
        self.processor = TENSOR_PROCESSORS.get(arch_name, TensorProcessor)(config=config)

    def _gguf_name(self, name: str) -> str | None:
        module, _, suffix = name.rpartition(".")
        found = self.names.get_name("model." + module)
        return None if found is None else f"{found}.{suffix}"

    def shape(self, name: str) -> tuple[int, ...] | None:
        key = self._gguf_name(name)
        return self.file.shape(key) if key in self.file.tensors else None

    def get(self, name: str) -> torch.Tensor:
        key = self._gguf_name(name)
        try:
            weights = self.processor.process(weights=self.file.tensor(key), name=key).weights
        except CheckpointError:
            raise
        except Exception as exc:  # gguf's dequantiser or transformers' processor on a corrupt tensor: one line
            raise CheckpointError(f"{self.path}: cannot dequantise {key} ({type(exc).__name__}: {exc})") from None
        return torch.from_numpy(np.ascontiguousarray(weights, dtype=np.float64))
