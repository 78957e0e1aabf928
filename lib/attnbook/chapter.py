"""One call at the top of a chapter: its device, its recorded parameters, and a data writer and reader bound to it.

    book = attnbook.setup("chapters/02_one_head.ipynb", globals())
    book.write_csv("one_head/width_sweep.csv", header, rows)
    rows = book.read_csv("one_head/width_sweep.csv")

The parameters recorded with every data file are the names the notebook's ``parameters`` cell
assigns, with the values they hold when ``setup`` runs (papermill's overrides included),
except those that cannot change a result (``UNRECORDED``).
"""

from __future__ import annotations

import csv
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from attnbook import style
from attnbook.devices import describe_device, resolve_device
from attnbook.paths import data_dir, repo_root
from attnbook.provenance import check_pair, notebook_parameters, write_csv

NOT_A_DEPENDENCY = "binds a notebook's name, parameters and device to the writer; every value it passes is recorded in the sidecar"

# DEVICE is recorded as the device itself; PROGRESS only draws progress bars.
UNRECORDED = frozenset({"DEVICE", "PROGRESS"})


@dataclass(frozen=True)
class Chapter:
    """A chapter's settings and its bound data writer and reader."""

    notebook: str
    root: Path
    device: torch.device
    parameters: dict[str, Any]
    inputs: dict[str, str] = field(default_factory=dict)  # {data file read: its sha256}, recorded with every write

    @property
    def device_name(self) -> str:
        """'cpu' or the CUDA device's name, as the provenance records it."""
        return describe_device(self.device)

    def write_csv(self, name: str, header: Sequence[str], rows: Iterable[Sequence[Any]]) -> Path:
        """Write data/<name> atomically with its provenance sidecar."""
        return write_csv(name, header, rows, notebook=self.notebook, parameters=self.parameters,
                         device=self.device_name, root=self.root, inputs=self.inputs)

    def provenance(self, name: str) -> dict[str, Any]:
        """The provenance record of data/<name> (its writer, parameters, versions), after checking the pair."""
        return check_pair(data_dir(self.root) / name)

    def read_csv(self, name: str) -> list[dict[str, str]]:
        """The rows of data/<name> as dicts of strings, after checking the file against its sidecar."""
        path = data_dir(self.root) / name
        record = check_pair(path)
        if record["notebook"] != self.notebook:  # another writer's file: what this notebook writes next depends on it
            self.inputs[record["file"]] = record["sha256"]
        with open(path, newline="") as handle:
            return list(csv.DictReader(handle))


def setup(notebook: str, namespace: Mapping[str, Any]) -> Chapter:
    """The chapter ``notebook`` (a path from the book's root), reading its parameters from ``namespace``."""
    root = repo_root()
    path = root / notebook
    if not path.is_file():
        raise FileNotFoundError(f"no notebook {notebook!r} under the book root {root}")
    names = sorted(set(notebook_parameters(path)) - UNRECORDED)
    missing = [n for n in names if n not in namespace]
    if missing:
        raise NameError(f"run the parameters cell first: {', '.join(missing)} not defined")
    style.apply()
    device = resolve_device(namespace.get("DEVICE", "cpu"))
    return Chapter(notebook, root, device, {n: namespace[n] for n in names})
