"""The chapter grids: one definition each, and every chapter builds its grid through it."""

import json

import pytest

from attnbook.grids import CHAPTER_GRIDS, biases, rope
from attnbook.paths import repo_root
from attnbook.provenance import notebook_parameters


@pytest.mark.parametrize("notebook", sorted(CHAPTER_GRIDS))
def test_each_chapter_builds_its_grid_with_attnbook_grids(notebook: str) -> None:
    cells = json.loads((repo_root() / notebook).read_text())["cells"]
    code = "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "code")
    assert "grids." in code and "specs = [" not in code and "specs.append(" not in code


@pytest.mark.parametrize("notebook", sorted(CHAPTER_GRIDS))
def test_grids_rebuild_from_the_chapter_defaults(notebook: str) -> None:
    main, other = CHAPTER_GRIDS[notebook](notebook_parameters(repo_root() / notebook))
    assert main and len(set(main)) == len(main)  # no layout checked twice in one grid


def test_the_variant_grids_cover_every_normalisation_and_the_sink_exception() -> None:
    assert {s.norm for s in biases(8)} == {s.norm for s in rope(8)} == {"softmax", "sink", "sigmoid"}
    wide = [s for s in biases(8) if s.head_dim > s.d_model]
    assert [s.sink_learned for s in wide] == [False, True]
