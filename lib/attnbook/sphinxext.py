"""The book's small Sphinx extension (listed in _config.yml under sphinx.extra_extensions).

- Drops sphinx-thebe's scripts from every page: the book has no live-code (thebe) button,
  and the extension declares ``const THEBE_JS_URL`` in an inline script that Sphinx emits
  twice, which throws a SyntaxError on every page.
- Ends every chapter built from a notebook with a link to a zip of the data behind it
  (attnbook.downloads), written into the built book under _downloads/data/.
- Serves _vendor/ (where scripts/fetch_mathjax.py installs the pinned MathJax) as static
  files, and fails the build with a clear message when MathJax is not installed there.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sphinx.errors import ExtensionError

THEBE_MARKERS = ("THEBE_JS_URL", "sphinx-thebe.js", "thebe@")
VENDOR = "_vendor"  # scripts/fetch_mathjax.py installs MathJax here


def _is_thebe(script: Any) -> bool:
    """Whether a Sphinx JavaScript entry (inline body or file) belongs to sphinx-thebe."""
    text = f"{script} {getattr(script, 'filename', '')} {getattr(script, 'attributes', {}).get('body', '')}"
    return any(marker in text for marker in THEBE_MARKERS)


def drop_thebe(app: Any, pagename: str, templatename: str, context: dict[str, Any], doctree: Any) -> None:
    """html-page-context handler: remove sphinx-thebe's scripts from the page."""
    if "script_files" in context:
        context["script_files"] = [s for s in context["script_files"] if not _is_thebe(s)]


def serve_vendor(app: Any, config: Any) -> None:
    """config-inited handler: add _vendor/ to html_static_path (checked to hold the local MathJax)."""
    path = str(config.mathjax_path)
    if "://" in path:
        return
    vendor = Path(app.confdir) / VENDOR
    if not (vendor / path).is_file():
        raise ExtensionError(f"{VENDOR}/{path} is missing: run `python scripts/fetch_mathjax.py` "
                             "(make book does) to install the book's pinned MathJax")
    config.html_static_path = [*config.html_static_path, str(vendor)]


DATA_DOWNLOADS = "_downloads/data"


def data_download(app: Any, pagename: str, templatename: str, context: dict[str, Any], doctree: Any) -> None:
    """html-page-context handler: zip a notebook chapter's data files and link the zip at the page's end."""
    from .downloads import chapter_data_files, write_zip  # noqa: PLC0415 (the build's own helpers)

    if doctree is None or "body" not in context or app.builder.name != "html":
        return
    root = Path(app.srcdir)
    notebook = f"{pagename}.ipynb"
    files = chapter_data_files(root, notebook)
    if not files:
        return
    name = f"{Path(pagename).name}-data.zip"
    write_zip(files, root, Path(app.outdir) / DATA_DOWNLOADS / name)
    href = context["pathto"](f"{DATA_DOWNLOADS}/{name}", 1)
    count = sum(1 for f in files if not f.name.endswith(".provenance.json"))
    context["body"] += (f'<p class="chapter-data"><a class="reference download" download href="{href}">'
                        f'Download the data behind this chapter</a> ({count} CSV file{"s" if count != 1 else ""} '
                        f'with their provenance, {name}).</p>')


def setup(app: Any) -> dict[str, Any]:
    app.connect("html-page-context", data_download)
    app.connect("config-inited", serve_vendor)
    app.connect("html-page-context", drop_thebe, priority=900)
    return {"parallel_read_safe": True, "parallel_write_safe": True, "version": "1"}
