"""The census's whole-model column (attnid.hf.census_whole, lib/attnid/whole_configs.yaml): every census model has a
configuration; each counted one describes the census entry's attention layers and, built by transformers on the
meta device (no memory, no weights), has exactly the number of parameters the whole-model count states."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from attnid.census import census, load_layouts
from attnid.census import CENSUS_COLUMNS, census_table
from attnid.hf.census_whole import load_configs, whole_column, whole_table, with_whole
from attnid.hf.config import count_config
from attnid.hf.whole import STRUCTURES, transformers_config

LAYOUTS = load_layouts()
CONFIGS = load_configs()
COLUMN = whole_column(census(LAYOUTS), CONFIGS)
COUNTED = [row for row in COLUMN if row.parameters is not None]


def test_every_census_model_has_a_row_and_every_covered_model_type_is_counted() -> None:
    assert [r.key for r in COLUMN] == [lay.key for lay in LAYOUTS]
    assert set(CONFIGS) == {lay.key for lay in LAYOUTS}
    for row in COLUMN:
        model_type = CONFIGS[row.key]["config"]["model_type"]
        if model_type in STRUCTURES:
            assert row.parameters is not None and row.unidentified is not None, (row.key, row.note)
            assert 0 < row.unidentified < row.parameters and row.note == ""
        else:
            assert row.parameters is None and repr(model_type) in row.note and "outside" in row.note
    assert len(COUNTED) == len(whole_table(COLUMN)) >= 9
    assert all(sum(row.breakdown.values()) == row.unidentified for row in COUNTED)


def test_the_census_table_gains_the_whole_model_share_beside_the_attention_share() -> None:
    columns, table = with_whole(CENSUS_COLUMNS, census_table(census(LAYOUTS)), COLUMN)
    at = columns.index("whole model")
    assert columns[at - 1] == "ratio" and len(columns) == len(CENSUS_COLUMNS) + 1
    shares = {row[0]: row[at] for row in table}
    # Llama-2-7B by hand: 32 layers of the census's attention orbit (528,384 each), one scale per SwiGLU unit, two
    # pre-norm gains per layer against their readers, the stream's rotations O(4096) (untied head), the final gain
    unidentified = 32 * 528_384 + 32 * 11_008 + 2 * 32 * 4_096 + 4_096 * 4_095 // 2 + 4_096
    assert shares["Llama-2-7B"] == f"{unidentified / 6_738_415_616:.5f}" and shares["Mixtral-8x7B"] == "n/a"


@pytest.mark.parametrize("row", COUNTED, ids=lambda r: r.key)
def test_transformers_builds_the_stated_number_of_parameters(row) -> None:
    from transformers import AutoModelForCausalLM, AutoModelForMaskedLM

    data = CONFIGS[row.key]["config"]
    config = transformers_config(data)
    auto = AutoModelForMaskedLM if data["architectures"][0].endswith("ForMaskedLM") else AutoModelForCausalLM
    with torch.device("meta"):
        model = auto.from_config(config)
    assert type(model).__name__ == data["architectures"][0]
    assert sum(p.numel() for p in model.parameters()) == row.parameters  # a tied head's matrix counted once


@pytest.mark.parametrize("row", COUNTED, ids=lambda r: r.key)
def test_the_configuration_describes_the_census_entrys_attention_layers(row) -> None:
    layout = next(lay for lay in LAYOUTS if lay.key == row.key)
    groups = count_config(dict(CONFIGS[row.key]["config"])).counted
    assert sum(g.layers for g in groups) == layout.layers
    assert {g.count.spec for g in groups} == {spec for _, spec in layout.layer_specs()}


def test_a_bad_configuration_file_is_refused_with_one_line(tmp_path: Path) -> None:
    cases = {"models: {gpt2: {source: x}}": "exactly the keys source and config",
             "models: {gpt2: {source: '', config: {model_type: gpt2}}}": "source must be a non-empty string",
             "models: {gpt2: {source: x, config: {vocab_size: 3}}}": "config must be a mapping with a model_type",
             "layouts: {}": "one key, models"}
    for text, message in cases.items():
        path = tmp_path / "c.yaml"
        path.write_text(text, encoding="utf-8")
        with pytest.raises(ValueError, match=message):
            load_configs(path)
    with pytest.raises(ValueError, match="no whole-model configuration for census model"):
        whole_column(census(LAYOUTS[:2]), {LAYOUTS[0].key: CONFIGS[LAYOUTS[0].key]})
