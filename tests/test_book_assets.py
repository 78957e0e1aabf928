"""The book's build-time assets: the pinned MathJax (scripts/fetch_mathjax.py) and the
chapter data downloads (attnbook.downloads)."""

from __future__ import annotations

import hashlib
import io
import json
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

from attnbook.downloads import chapter_data_files, write_zip

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
import fetch_mathjax  # noqa: E402


def tarball(members: dict[str, bytes]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def test_a_tarball_that_is_not_the_pinned_one_is_refused() -> None:
    data = tarball({"package/tex-chtml.js": b"evil"})
    with pytest.raises(fetch_mathjax.ChecksumError, match="expected " + fetch_mathjax.SHA256):
        fetch_mathjax.check(data)
    fetch_mathjax.check(data, hashlib.sha256(data).hexdigest())


def test_unpack_keeps_the_browser_components_and_the_fonts_chtml_files_and_stamps_both_pins(tmp_path: Path) -> None:
    data = tarball({"package/tex-chtml.js": b"js", "package/input/tex/extensions/ams.js": b"ams", "package/LICENSE": b"l",
                    "package/node-main.cjs": b"node", "package/package.json": b"{}", "package/README.md": b"#"})
    font = tarball({"package/chtml.js": b"font", "package/chtml/woff2/a.woff2": b"w", "package/svg/a.js": b"svg",
                    "package/cjs/x.js": b"node"})
    target = tmp_path / "_vendor" / "mathjax"
    assert fetch_mathjax.unpack(data, target, font) == 5
    assert sorted(p.relative_to(target).as_posix() for p in target.rglob("*") if p.is_file()) == [
        ".version", "LICENSE", "fonts/mathjax-newcm-font/chtml.js", "fonts/mathjax-newcm-font/chtml/woff2/a.woff2",
        "input/tex/extensions/ams.js", "tex-chtml.js"]
    assert fetch_mathjax.installed(target)
    fetch_mathjax.unpack(data, target)  # without the font: not the pinned installation
    assert not fetch_mathjax.installed(target)


def test_unpack_refuses_a_path_outside_the_target(tmp_path: Path) -> None:
    data = tarball({"package/tex-chtml.js": b"js", "package/../../escape.js": b"x"})
    with pytest.raises(fetch_mathjax.ChecksumError, match="unsafe path"):
        fetch_mathjax.unpack(data, tmp_path / "mathjax")
    assert not (tmp_path / "escape.js").exists() and not (tmp_path / "mathjax").exists()


def make_data(root: Path, name: str, writer: str) -> None:
    path = root / "data" / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("a,b\n1,2\n")
    path.with_name(path.name + ".provenance.json").write_text(json.dumps({"notebook": writer}))


def test_chapter_data_are_what_it_wrote_or_names(tmp_path: Path) -> None:
    (tmp_path / "chapters").mkdir()
    (tmp_path / "chapters" / "09.ipynb").write_text('{"source": "book.read_csv(\\"experiments/runs.csv\\")"}')
    make_data(tmp_path, "training/own.csv", "chapters/09.ipynb")
    make_data(tmp_path, "experiments/runs.csv", "experiments/train.ipynb")
    make_data(tmp_path, "other/unrelated.csv", "chapters/02.ipynb")
    names = [p.relative_to(tmp_path / "data").as_posix() for p in chapter_data_files(tmp_path, "chapters/09.ipynb")]
    assert names == ["experiments/runs.csv", "experiments/runs.csv.provenance.json",
                     "training/own.csv", "training/own.csv.provenance.json"]
    assert chapter_data_files(tmp_path, "chapters/missing.ipynb") == []


def test_the_zip_is_byte_identical_when_rebuilt(tmp_path: Path) -> None:
    make_data(tmp_path, "x/a.csv", "chapters/01.ipynb")
    files = sorted((tmp_path / "data").rglob("*.*"))
    first = write_zip(files, tmp_path, tmp_path / "one.zip").read_bytes()
    second = write_zip(list(reversed(files)), tmp_path, tmp_path / "two.zip").read_bytes()
    assert first == second
    assert zipfile.ZipFile(io.BytesIO(first)).namelist() == ["data/x/a.csv", "data/x/a.csv.provenance.json"]
