"""``attnid rebalance IN OUT``: the same function at a named point of its orbit, written as a new checkpoint.

The representative ``balanced`` (``representative``) is reached in two moves, each proved not to change
the function (chapter "Trained models"):

1. the dead parameters go to zero: the key bias on its unrotated coordinates (softmax is blind to a
   constant added to every score of a row), and the value bias folded into the output bias
   (b_O + sum_h b_V^g W_O^h; each row of attention weights sums to one);
2. each key/value group moves along its symmetry orbit to the balanced point of ``attnid.balancing``:
   the point of least norm, where the query and key Grams agree (on the RoPE commutant) and so do the value
   and output Grams; in particular ||[W_Q; b_Q]||_F = ||W_K||_F and ||[W_V; b_V]||_F = ||W_O||_F per group.
   Layers with a QK-norm only take step 1 (their orbit is another group).

Before anything is written, the new weights are loaded into transformers next to the old ones and both
run on a fixed English text; OUT is written only if the new model's float32 output lies within
``TOLERANCE_FACTOR`` times the old model's own float32 round-off (its float32 output against its float64
output). OUT is built in a temporary sibling folder and renamed (a GGUF file: hard-linked) into place:
it is absent or complete, and an existing OUT is never touched.

IN may be a safetensors folder (OUT is one too, all weights in one model.safetensors) or a GGUF file.
OUT is then a GGUF file with the same metadata and tensors, but the moved attention tensors are float32
(``attnid.hf.gguf_write``); a tensor that does not move keeps its bytes. Rounding the moved ones back to the
source's quantised blocks would change the function.
The function kept is the one transformers computes from IN, which dequantises every tensor when it loads.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch
from tqdm import tqdm

from attnid.balancing import SingularGramError, balance
from attnid.hf.atpoint import without_dead
from attnid.hf.checkpoint import Checkpoint, CheckpointError, open_checkpoint
from attnid.hf.gguf_write import stored_values, write_like
from attnid.spec import AttentionSpec, Params

REPRESENTATIVES = ("balanced",)
# OUT may differ from IN by this many times IN's own float32 round-off: the new weights are rounded to float32
# once more, which adds about as much again.
TOLERANCE_FACTOR = 4.0
# The check's text: plain English written for this purpose, tokenised by the checkpoint's own tokenizer.
CHECK_TEXT = ("A layer of attention mixes the tokens of a sentence. Each head compares queries with keys, "
              "weighs the values, and writes the result back. Many weights give the same mixing, "
              "so a model can be moved along those weights without changing what it computes.")
WEIGHT_SUFFIXES = (".safetensors",)
WEIGHT_NAMES = ("model.safetensors.index.json",)


def representative(params: Params, spec: AttentionSpec) -> tuple[dict[str, torch.Tensor], str]:
    """``params`` moved to the balanced representative of its orbit (dead parameters zeroed first), and a note.

    The note is empty, or says why the layer took step 1 only: a QK-norm, or a factor whose Gram matrix is
    singular (a degenerate layer has no balanced point).
    """
    moved = without_dead(params, spec)
    if spec.has_qk_norm:
        return moved, "QK-norm: dead parameters only"
    try:
        return balance(moved, spec), ""
    except SingularGramError as exc:
        return moved, f"dead parameters only: {exc}"


def _location(path: Path) -> tuple[str, dict[str, str]]:
    """What transformers' from_pretrained takes for a checkpoint folder or a GGUF file."""
    return (str(path.parent), {"gguf_file": path.name}) if path.is_file() else (str(path), {})


def _outputs(path: Path, dtype: torch.dtype, ids: torch.Tensor) -> torch.Tensor:
    from transformers import AutoModel

    where, extra = _location(path)
    model = AutoModel.from_pretrained(where, dtype=dtype, **extra).eval()
    with torch.no_grad():
        return model(input_ids=ids).last_hidden_state.to(torch.float64)


def _check_ids(source: Path, vocab: int) -> torch.Tensor:
    """The check text's token ids: the checkpoint's own tokenizer, else fixed ids spread over the vocabulary."""
    try:
        from transformers import AutoTokenizer

        where, extra = _location(source)
        ids = AutoTokenizer.from_pretrained(where, **extra)(CHECK_TEXT, return_tensors="pt")["input_ids"]
        if ids.numel() and int(ids.max()) < vocab:
            return ids
    except (OSError, ValueError, TypeError, KeyError):
        pass
    return (torch.arange(48)[None] * 7919 + 11) % vocab


def check_same_function(source: Path, candidate: Path, vocab: int) -> dict[str, float]:
    """Relative differences on the check text: IN's own float32 round-off, and OUT against IN in float32 and float64."""
    ids = _check_ids(source, vocab)
    ref = _outputs(source, torch.float64, ids)
    scale = float(ref.abs().max()) or 1.0
    own = float((_outputs(source, torch.float32, ids) - ref).abs().max()) / scale
    out32 = float((_outputs(candidate, torch.float32, ids) - ref).abs().max()) / scale
    out64 = float((_outputs(candidate, torch.float64, ids) - ref).abs().max()) / scale
    return {"tokens": int(ids.numel()), "own_float32_roundoff": own, "float32_difference": out32,
            "float64_difference": out64, "tolerance": TOLERANCE_FACTOR * own}


def rebalance(source: Path | str, out: Path | str, *, to: str = "balanced", progress: bool = False) -> dict[str, Any]:
    """Write OUT: IN's function at the representative ``to``; returns the check's figures. CheckpointError if refused."""
    source, out = Path(source), Path(out)
    if to not in REPRESENTATIVES:
        raise CheckpointError(f"--to {to!r}: the representatives are {', '.join(REPRESENTATIVES)}")
    if out.exists() or out.is_symlink():
        raise CheckpointError(f"{out}: already exists; rebalance never overwrites (remove it or choose another OUT)")
    checkpoint = open_checkpoint(source)
    if not out.parent.is_dir():
        raise CheckpointError(f"{out.parent}: no such folder")
    if checkpoint.format == "gguf" and out.suffix != ".gguf":
        raise CheckpointError(f"{out}: IN is a GGUF file, so OUT is one too: give it the suffix .gguf")
    moved, notes = {}, {}
    for i in tqdm(range(checkpoint.n_layers), desc="rebalance: layers", unit="layer", disable=not progress,
                  file=sys.stderr, leave=False):
        params, note = representative(checkpoint.layer(i), checkpoint.specs[i])
        if note:
            notes[str(i)] = note
        moved |= checkpoint.tensors(i, params)
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}.partial-", dir=out.parent))
    try:
        written = _write_gguf(checkpoint, staging, out.name, moved) if checkpoint.format == "gguf" else \
            _write(source, staging, checkpoint, moved)
        figures = check_same_function(source, written, _vocab_size(checkpoint))
        if not figures["float32_difference"] <= figures["tolerance"]:
            raise CheckpointError(f"the rebalanced model differs from IN by {figures['float32_difference']:.2e} "
                                  f"(relative), more than {TOLERANCE_FACTOR:g} times IN's own float32 round-off "
                                  f"({figures['own_float32_roundoff']:.2e}); nothing written")
        try:
            if checkpoint.format == "gguf":
                os.link(written, out)  # atomic, and fails if OUT appeared meanwhile (OUT is then left as it was)
            else:
                os.rename(staging, out)  # atomic; fails if a non-empty OUT appeared meanwhile
        except OSError as exc:
            raise CheckpointError(f"{out}: cannot put the new checkpoint in place ({exc}); nothing written") from None
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return {**figures, "layers_not_balanced": notes}


def _write_gguf(checkpoint: Checkpoint, staging: Path, name: str, moved: dict[str, torch.Tensor]) -> Path:
    """IN's GGUF file with the moved attention tensors stored as float32 (``attnid.hf.gguf_write``)."""
    source = checkpoint._source
    replaced = dict(stored_values(source, hf_name, values) for hf_name, values in moved.items()
                    if not torch.equal(values, source.get(hf_name)))  # a tensor that did not move keeps its bytes
    path = staging / name
    with path.open("wb") as f:
        write_like(source.file, f, replaced)
    return path


def _vocab_size(checkpoint: Checkpoint) -> int:
    """The vocabulary the check's token ids must lie in: the configuration's, else a GGUF file's embedding rows
    (not every GGUF file records its vocabulary size)."""
    size = checkpoint.config.get("vocab_size")
    if isinstance(size, int) and size > 0:
        return size
    if checkpoint.format == "gguf" and "token_embd.weight" in checkpoint._source.file.tensors:
        return checkpoint._source.file.shape("token_embd.weight")[0]
    return 2


def _write(source: Path, staging: Path, checkpoint: Checkpoint, moved: dict[str, torch.Tensor]) -> Path:
    """The new weights as one model.safetensors, and every other file of IN (config, tokenizer) copied."""
    from safetensors.torch import save_file

    state = checkpoint.all_tensors()
    state |= {name: tensor.to(state[name].dtype).contiguous() for name, tensor in moved.items()}
    for item in source.iterdir():
        if item.is_file() and not item.name.endswith(WEIGHT_SUFFIXES) and item.name not in WEIGHT_NAMES:
            shutil.copy2(item, staging / item.name)
        elif item.is_dir():
            shutil.copytree(item, staging / item.name)
    save_file(state, str(staging / "model.safetensors"), metadata={"format": "pt"})
    return staging
