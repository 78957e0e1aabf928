#!/usr/bin/env python3
"""Install the pinned MathJax and its font under _vendor/mathjax, so the book typesets its math offline.

The book never loads MathJax from a CDN at read time: `make book` runs this first. It fetches
two npm tarballs from the npm registry (once; they are cached under .cache/), checks each
against its pinned sha256, and unpacks them into _vendor/mathjax/: MathJax 4's browser
components (and the TeX extensions it loads on demand), and the CommonHTML files of its
default font, New Computer Modern, under fonts/mathjax-newcm-font/ (_config.yml points
MathJax's ``fonts`` path there instead of the CDN). MathJax 4 breaks a display equation that
is wider than its column over several lines, so no equation needs a sideways scroll on a phone
or is clipped in the PDF. A second run with the same pins does nothing. The book's Sphinx extension (attnbook.sphinxext) adds _vendor/ to the
static files, so the built book serves it as _static/mathjax/, where `mathjax_path` in
_config.yml points. (Not under _static/ itself: Jupyter Book would add every .js file there
to every page.)

Usage: fetch_mathjax.py [--root DIR] [--tarball FILE]
"""

from __future__ import annotations

import argparse
import hashlib
import io
import re
import shutil
import sys
import tarfile
import tempfile
import urllib.request
from pathlib import Path

VERSION = "4.1.3"
SHA256 = "b7109f516f3d842de62b95d653e35fa0976dc223706a2a77440e7f7723f0c54d"
URL = f"https://registry.npmjs.org/mathjax/-/mathjax-{VERSION}.tgz"
PREFIX = "package/"  # the browser components (MathJax 4 ships them at the package's top level)
ENTRY = "tex-chtml.js"  # the component _config.yml's mathjax_path names
FONT_SHA256 = "87d7b869c6a2a6169d9a53acc4eab6c846a9cbe11752738226461bb5070c8b88"
FONT_URL = f"https://registry.npmjs.org/@mathjax/mathjax-newcm-font/-/mathjax-newcm-font-{VERSION}.tgz"
FONT_PREFIX = "package/chtml"  # chtml.js and chtml/ (woff2 fonts, dynamic ranges); the SVG and Node files are not needed
FONT_DIR = "fonts/mathjax-newcm-font"  # under _vendor/mathjax: _config.yml's loader path [mathjax]/fonts
ROOT = Path(__file__).resolve().parents[1]
VENDOR = "_vendor"  # attnbook.sphinxext.VENDOR


class ChecksumError(RuntimeError):
    """The tarball is not the pinned one."""


def check(data: bytes, expected: str = SHA256, name: str = f"mathjax-{VERSION}.tgz") -> None:
    """Raise ChecksumError unless sha256(data) is ``expected``."""
    got = hashlib.sha256(data).hexdigest()
    if got != expected:
        raise ChecksumError(f"{name} has sha256 {got}, expected {expected} (pinned in {Path(__file__).name})")


def download(url: str = URL, timeout: float = 120.0) -> bytes:
    """The bytes at ``url``, read in one go."""
    with urllib.request.urlopen(url, timeout=timeout) as response:  # noqa: S310 (a pinned https URL)
        return response.read()


NODE_ONLY = re.compile(r"^package/(node-main[^/]*|require\.mjs|[^/]+\.(md|json|cjs|mjs))$")  # not for a browser


def _extract(data: bytes, prefix: str, keep: str, into: Path) -> int:
    """Write the files of the tarball ``data`` whose names start with ``prefix`` under ``into``, named from ``keep`` on
    (Node's entry points and the package's metadata left out)."""
    count = 0
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
        for member in tar.getmembers():
            if not member.isfile() or not member.name.startswith(prefix) or NODE_ONLY.match(member.name):
                continue
            relative = Path(member.name[len(keep):])
            if relative.is_absolute() or ".." in relative.parts:
                raise ChecksumError(f"unsafe path in tarball: {member.name}")
            out = into / relative
            out.parent.mkdir(parents=True, exist_ok=True)
            source = tar.extractfile(member)
            assert source is not None
            out.write_bytes(source.read())
            count += 1
    return count


def unpack(data: bytes, target: Path, font: bytes | None = None) -> int:
    """Unpack MathJax's components (and the font's CommonHTML files under FONT_DIR) into ``target``, replacing it
    atomically. Returns the file count."""
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=target.parent, prefix=".mathjax."))
    try:
        count = _extract(data, PREFIX, PREFIX, staging)
        if not (staging / ENTRY).is_file():
            raise ChecksumError(f"the tarball has no {PREFIX}{ENTRY}")
        if font is not None:
            count += _extract(font, FONT_PREFIX, "package/", staging / FONT_DIR)
            if not (staging / FONT_DIR / "chtml.js").is_file():
                raise ChecksumError(f"the font tarball has no {FONT_PREFIX}.js")
        (staging / ".version").write_text(f"{VERSION} {SHA256} {FONT_SHA256 if font is not None else '-'}\n")
        if target.exists():
            shutil.rmtree(target)
        staging.rename(target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return count


def installed(target: Path) -> bool:
    """Whether ``target`` already holds the pinned version."""
    stamp = target / ".version"
    return stamp.is_file() and stamp.read_text().split() == [VERSION, SHA256, FONT_SHA256]


def _fetch(root: Path, name: str, url: str, sha256: str, local: Path | None) -> bytes:
    """The checked bytes of tarball ``name``: from ``local``, else the cache under .cache/, else ``url`` (then cached)."""
    cache = root / ".cache" / name
    if local is not None:
        data = local.read_bytes()
    elif cache.is_file():
        data = cache.read_bytes()
    else:
        print(f"fetching {name} from the npm registry ...", flush=True)
        data = download(url)
    check(data, sha256, name)
    if not cache.is_file():
        cache.parent.mkdir(parents=True, exist_ok=True)
        cache.write_bytes(data)
    return data


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--root", type=Path, default=ROOT, help="the book's root (default: this checkout)")
    parser.add_argument("--tarball", type=Path, help="use this local MathJax tarball instead of the registry (still checked)")
    parser.add_argument("--font-tarball", type=Path, help="use this local font tarball instead of the registry (still checked)")
    args = parser.parse_args(argv)
    target = args.root / VENDOR / "mathjax"
    if installed(target):
        return 0
    try:
        data = _fetch(args.root, f"mathjax-{VERSION}.tgz", URL, SHA256, args.tarball)
        font = _fetch(args.root, f"mathjax-newcm-font-{VERSION}.tgz", FONT_URL, FONT_SHA256, args.font_tarball)
    except (OSError, ChecksumError) as err:
        print(f"fetch_mathjax: {err}", file=sys.stderr)
        return 1
    count = unpack(data, target, font)
    print(f"MathJax {VERSION}: {count} files in {target.relative_to(args.root) if target.is_relative_to(args.root) else target}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
