"""attnbook.style: SVG figures fitted to the text column, the same bytes on every run."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from IPython.core.pylabtools import print_figure  # noqa: E402

from attnbook import style as figures  # noqa: E402


def drawn(width: float) -> str:
    with plt.rc_context(figures.RC):
        fig, ax = plt.subplots(figsize=(width, 3.0))
        ax.plot([1, 2, 3], [3, 1, 2], "o-", label="data")
        ax.legend()
        fig.tight_layout()
        text = figures.svg(fig)
        size = fig.get_size_inches()
        plt.close(fig)
    return text, size


def test_two_drawings_are_byte_identical_and_undated() -> None:
    first, _ = drawn(5.0)
    second, _ = drawn(5.0)
    assert first == second
    assert first.lstrip().startswith("<?xml") and "<dc:date>" not in first


def test_a_wide_figure_is_fitted_to_the_column_keeping_its_aspect() -> None:
    _, size = drawn(11.0)
    assert abs(size[0] - figures.COLUMN_WIDTH_IN) < 1e-9
    assert abs(size[1] - 3.0 * figures.COLUMN_WIDTH_IN / 11.0) < 1e-9
    _, narrow = drawn(5.0)
    assert abs(narrow[0] - 5.0) < 1e-9  # a figure that fits is left alone


def test_the_salt_fixes_the_ids() -> None:
    salted, _ = drawn(4.0)
    with plt.rc_context({**figures.RC, "svg.hashsalt": "other"}):
        fig, ax = plt.subplots(figsize=(4.0, 3.0))
        ax.plot([1, 2, 3], [3, 1, 2], "o-", label="data")
        ax.legend()
        fig.tight_layout()
        other = print_figure(fig, "svg", bbox_inches="tight", metadata=figures.SVG_METADATA)
        plt.close(fig)
    assert salted != other  # the ids come from the salt, so fixing it is what makes runs repeatable


def _nudged(offset: float) -> tuple[str, str]:
    """(raw SVG, the book's SVG) of one figure whose axes sit ``offset`` (a figure fraction) to the right."""
    with plt.rc_context(figures.RC):
        fig = plt.figure(figsize=(5.0, 3.0))
        ax = fig.add_axes((0.125 + offset, 0.11, 0.775, 0.77))
        ax.plot([1, 2, 3], [3, 1, 2], "o-")
        raw = print_figure(fig, "svg", bbox_inches=None, metadata=figures.SVG_METADATA)
        text = figures.stable_ids(raw)
        plt.close(fig)
    return raw, text


def test_ids_do_not_depend_on_the_last_bits_of_a_coordinate() -> None:
    # Another CPU moves a layout by a rounding error; matplotlib hashes the clip box's floats into its id.
    raw, text = _nudged(0.0)
    raw_moved, text_moved = _nudged(1e-15)
    assert raw != raw_moved  # the hashed ids differ, though every printed coordinate is the same
    assert text == text_moved
    assert 'id="p1"' in text and "url(#p1)" in text and 'id="m1"' in text and 'href="#m1"' in text
    assert not figures.HASHED_ID.search(text)


def test_stable_ids_keeps_distinct_ids_distinct() -> None:
    svg = '<a id="p0123456789"/><b id="pabcdefabcd"/><c clip-path="url(#pabcdefabcd)"/><d href="#p0123456789"/>'
    assert figures.stable_ids(svg) == '<a id="p1"/><b id="p2"/><c clip-path="url(#p2)"/><d href="#p1"/>'
