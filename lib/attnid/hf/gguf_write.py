"""A GGUF file written like another, with some tensors replaced: the GGUF half of ``attnid rebalance``.

The new file keeps the source's metadata bytes as they are (architecture, tokenizer, every field) and
every tensor it does not replace, bytes and type. A replaced tensor is stored as float32 (GGML type F32):
rounding moved weights back to the source's 4-bit blocks would change the function, which is what
rebalancing must not do. A replaced tensor is given under transformers' Hugging Face name and values, as
``attnid.hf.gguf_file.GGUFSource`` reads them; it is stored in the file's own order by inverting the
permutation transformers' loader applies to it (llama.cpp stores query and key rows interleaved per rotary
pair). A loader that changes a tensor by more than a permutation of its elements is refused.
"""

from __future__ import annotations

import struct
from collections.abc import Mapping
from typing import BinaryIO

import numpy as np
import torch

from attnid.hf.errors import CheckpointError
from attnid.hf.gguf_file import DEFAULT_ALIGNMENT, GGUFFile, GGUFSource, _Cursor

F32 = 0  # GGML type of a float32 tensor


def loaded_order(source: GGUFSource, key: str) -> np.ndarray:
    """``order`` with loaded.flat[i] = stored.flat[order[i]]: where transformers' loader takes each element from.

    CheckpointError if the loader does more to the tensor than permute its elements.
    """
    shape = source.file.shape(key)
    n = int(np.prod(shape, dtype=np.int64))
    order = np.asarray(source.processor.process(weights=np.arange(n, dtype=np.float64).reshape(shape), name=key).weights)
    if order.shape != shape or not np.array_equal(np.sort(order.ravel()), np.arange(n, dtype=np.float64)):
        raise CheckpointError(f"{source.path}: transformers loads {key} by more than a permutation of its "
                              "elements; it cannot be written back")
    return order.ravel().astype(np.int64)


def stored_values(source: GGUFSource, name: str, values: torch.Tensor) -> tuple[str, np.ndarray]:
    """(the GGUF name, the float32 array to store) for the Hugging Face tensor ``name`` loaded as ``values``."""
    key = source._gguf_name(name)
    if key is None or key not in source.file.tensors:
        raise CheckpointError(f"{source.path}: no GGUF tensor for {name}")
    if tuple(values.shape) != source.file.shape(key):
        raise CheckpointError(f"{name}: shape {tuple(values.shape)}, but {key} loads as {source.file.shape(key)}")
    flat = values.detach().to("cpu", torch.float64).numpy().ravel()
    out = np.empty(flat.size, dtype=np.float32)
    out[loaded_order(source, key)] = flat
    return key, out.reshape(source.file.shape(key))


def _fields_end(file: GGUFFile) -> int:
    """The first byte after the metadata fields (where the tensor index begins)."""
    cursor = _Cursor(file.data, file.path)
    cursor.at = 24
    for _ in range(struct.unpack_from("<Q", file.data, 16)[0]):
        cursor.string()
        cursor.value(cursor.take("<I"), keep=False)
    return cursor.at


def _pad(f: BinaryIO, alignment: int) -> None:
    f.write(b"\0" * (-f.tell() % alignment))


def write_like(file: GGUFFile, out: BinaryIO, replaced: Mapping[str, np.ndarray]) -> None:
    """Write to ``out`` (at its start) ``file`` with the tensors of ``replaced`` (GGUF names) stored as float32."""
    unknown = set(replaced) - set(file.tensors)
    if unknown:
        raise CheckpointError(f"{file.path}: no tensors {', '.join(sorted(unknown))}")
    alignment = file.fields.get("general.alignment", DEFAULT_ALIGNMENT)
    entries: list[tuple[str, tuple[int, ...], int, bytes | None]] = []
    for name, (dims, kind, _) in file.tensors.items():
        if name in replaced:
            values = np.ascontiguousarray(replaced[name], dtype="<f4")
            if values.shape != file.shape(name):
                raise CheckpointError(f"{name}: shape {values.shape}, the file's is {file.shape(name)}")
            entries.append((name, dims, F32, values.tobytes()))
        else:
            entries.append((name, dims, kind, None))
    out.write(bytes(file.data[:_fields_end(file)]))
    offset = 0
    for name, dims, kind, data in entries:
        raw = name.encode("utf-8")
        out.write(struct.pack("<Q", len(raw)) + raw + struct.pack("<I", len(dims)))
        out.write(b"".join(struct.pack("<Q", d) for d in dims) + struct.pack("<IQ", kind, offset))
        size = len(data) if data is not None else file._extent(name)[1]
        offset += size + (-size % alignment)
    _pad(out, alignment)
    for name, _, _, data in entries:
        if data is None:
            first, count = file._extent(name)
            data = file.data[first:first + count]
        out.write(data)
        _pad(out, alignment)

