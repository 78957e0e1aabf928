#!/usr/bin/env python3
"""Install the pinned MathJax under _vendor/mathjax, so the book typesets its math offline.

The book never loads MathJax from a CDN at read time: `make book` runs this first. It fetches
the MathJax npm tarball from the npm registry (once; it is cached under .cache/), checks it
against the pinned sha256, and unpacks its es5/ folder (the browser bundles, fonts and the
TeX extensions that MathJax loads on demand) into _vendor/mathjax/. A second run with the
same pin does nothing. The book's Sphinx extension (attnbook.sphinxext) adds _vendor/ to the
static files, so the built book serves it as _static/mathjax/, where `mathjax_path` in
_config.yml points. (Not under _static/ itself: Jupyter Book would add every .js file there
to every page.)

Usage: fetch_mathjax.py [--root DIR] [--tarball FILE]
"""

from __future__ import annotations

import argparse
import hashlib
import io
import shutil
import sys
import tarfile
import tempfile
import urllib.request
from pathlib import Path

VERSION = "3.2.2"
SHA256 = "1b9c0a1c44df864e915690558e72adb9cc5203360daefd385084ced3b6c64c09"
URL = f"https://registry.npmjs.org/mathjax/-/mathjax-{VERSION}.tgz"
PREFIX = "package/es5/"  # what the browser needs; the rest of the package is Node source
ENTRY = "tex-chtml.js"  # the component _config.yml's mathjax_path names
ROOT = Path(__file__).resolve().parents[1]
VENDOR = "_vendor"  # attnbook.sphinxext.VENDOR


class ChecksumError(RuntimeError):
    """The tarball is not the pinned one."""


def check(data: bytes, expected: str = SHA256) -> None:
    """Raise ChecksumError unless sha256(data) is ``expected``."""
    got = hashlib.sha256(data).hexdigest()
    if got != expected:
        raise ChecksumError(f"mathjax-{VERSION}.tgz has sha256 {got}, expected {expected} (pinned in {Path(__file__).name})")


def download(url: str = URL, timeout: float = 120.0) -> bytes:
    """The bytes at ``url``, read in one go."""
    with urllib.request.urlopen(url, timeout=timeout) as response:  # noqa: S310 (a pinned https URL)
        return response.read()


def unpack(data: bytes, target: Path) -> int:
    """Unpack the es5/ members of the tarball ``data`` into ``target`` (replacing it atomically). Returns the file count."""
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=target.parent, prefix=".mathjax."))
    count = 0
    try:
        with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
            for member in tar.getmembers():
                if not member.isfile() or not member.name.startswith(PREFIX):
                    continue
                relative = Path(member.name[len(PREFIX):])
                if relative.is_absolute() or ".." in relative.parts:
                    raise ChecksumError(f"unsafe path in tarball: {member.name}")
                out = staging / relative
                out.parent.mkdir(parents=True, exist_ok=True)
                source = tar.extractfile(member)
                assert source is not None
                out.write_bytes(source.read())
                count += 1
        if not (staging / ENTRY).is_file():
            raise ChecksumError(f"the tarball has no {PREFIX}{ENTRY}")
        (staging / ".version").write_text(f"{VERSION} {SHA256}\n")
        if target.exists():
            shutil.rmtree(target)
        staging.rename(target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return count


def installed(target: Path) -> bool:
    """Whether ``target`` already holds the pinned version."""
    stamp = target / ".version"
    return stamp.is_file() and stamp.read_text().split() == [VERSION, SHA256]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--root", type=Path, default=ROOT, help="the book's root (default: this checkout)")
    parser.add_argument("--tarball", type=Path, help="use this local tarball instead of the registry (still checked)")
    args = parser.parse_args(argv)
    target = args.root / VENDOR / "mathjax"
    if installed(target):
        return 0
    cache = args.root / ".cache" / f"mathjax-{VERSION}.tgz"
    try:
        if args.tarball:
            data = args.tarball.read_bytes()
        elif cache.is_file():
            data = cache.read_bytes()
        else:
            print(f"fetching MathJax {VERSION} from the npm registry ...", flush=True)
            data = download()
        check(data)
    except (OSError, ChecksumError) as err:
        print(f"fetch_mathjax: {err}", file=sys.stderr)
        return 1
    cache.parent.mkdir(parents=True, exist_ok=True)
    if not cache.is_file():
        cache.write_bytes(data)
    count = unpack(data, target)
    print(f"MathJax {VERSION}: {count} files in {target.relative_to(args.root) if target.is_relative_to(args.root) else target}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
