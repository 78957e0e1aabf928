"""The book's small Sphinx extension (listed in _config.yml under sphinx.extra_extensions).

- Drops sphinx-thebe's scripts from every page: the book has no live-code (thebe) button,
  and the extension declares ``const THEBE_JS_URL`` in an inline script that Sphinx emits
  twice, which throws a SyntaxError on every page.
- Ends every chapter built from a notebook with a link to a zip of the data behind it
  (attnbook.downloads), written into the built book under _downloads/data/.
- Serves _vendor/ (where scripts/fetch_mathjax.py installs the pinned MathJax) as static
  files, and fails the build with a clear message when MathJax is not installed there.
- Writes every glued number (myst-nb's ``{glue:text}`` and ``{glue:}``) the way the prose writes numbers:
  ``power_of_ten`` turns the E notation of a format such as ``:.1e`` into a typeset power of ten
  (7.1e-03 becomes 7.1 × 10⁻³), the one rule for every chapter; a glued string that shows its
  quote marks (a repr glued) or a glued number set in bold is a build warning, which fails the
  book's ``-W`` build.
- Warns (so fails ``-W``) about a figure whose image has no alt text of its own: without ``:alt:``
  the HTML falls back to the image's file name, which is all a screen reader would say.
- Two directives for the API page: ``attnid-cli`` prints the ``attnid`` command's help, each
  subcommand's too, from the parser itself (``attnid.cli.build_parser``), and ``attnid-json-schemas``
  prints the schema of each subcommand's ``--json`` output (``attnid.schemas``).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from docutils import nodes
from sphinx.errors import ExtensionError
from sphinx.util import logging
from sphinx.util.docutils import SphinxDirective

NOT_A_DEPENDENCY = 'Sphinx extension of the rendered book: no data'

LOG = logging.getLogger(__name__)

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
    from attnbook.downloads import chapter_data_files, write_zip  # noqa: PLC0415 (the build's own helpers)

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


E_NOTATION = re.compile(r"(?<![\w.])([-+]?)(\d+(?:\.\d*)?)[eE]([-+]?)(\d+)(?![\w.])")
SUPERSCRIPTS = str.maketrans("0123456789-", "\u2070\u00b9\u00b2\u00b3\u2074\u2075\u2076\u2077\u2078\u2079\u207b")
MINUS = "\u2212"


def _power(match: re.Match[str]) -> str:
    sign, mantissa, exp_sign, exponent = match.groups()
    sign = MINUS if sign == "-" else sign
    power = int(exponent)
    if power == 0:
        return sign + mantissa
    ten = "10" + (("-" if exp_sign == "-" else "") + str(power)).translate(SUPERSCRIPTS)
    return sign + ten if mantissa == "1" else f"{sign}{mantissa} \u00d7 {ten}"


def power_of_ten(text: str) -> str:
    """Every number in E notation in ``text`` as the prose writes it; the rest unchanged.

    '7.1e-03' -> '7.1 × 10⁻³', '1e-10' -> '10⁻¹⁰', '-2.50e+02' -> '−2.50 × 10²', '+0.0e+00' -> '+0.0',
    '[7.2e-03, 9.4e-03]' -> '[7.2 × 10⁻³, 9.4 × 10⁻³]': the mantissa keeps its digits (they are
    the precision rule's), a mantissa of exactly 1 is dropped, a zero exponent leaves the mantissa
    alone, and a token inside a word (a hash such as 9f0e1e20) is not a number.
    """
    return E_NOTATION.sub(_power, text)


def _quoted(text: str) -> bool:
    return len(text) >= 2 and text[0] == text[-1] and text[0] in "'\""


def typeset_glued_numbers(app: Any, doctree: Any, docname: str) -> None:
    """doctree-resolved handler: every glued text through ``power_of_ten``; quotes and bold warned about."""
    for node in list(doctree.findall(nodes.inline)):
        classes = node.get("classes", [])
        if "pasted-text" not in classes and not {"output", "text_plain"} <= set(classes):  # {glue:text}, {glue:}
            continue
        text = node.astext()
        if _quoted(text):
            LOG.warning(f"a glued string shows its quote marks ({text[:40]}): glue it as Markdown or a number",
                        location=node)
        if isinstance(node.parent, nodes.strong):
            LOG.warning(f"a glued number is set in bold ({text[:40]}): the prose's numbers are plain", location=node)
        shown = power_of_ten(text)
        if shown != text:
            node.children = [nodes.Text(shown)]


ALT_MIN_WORDS = 6
FILE_NAME = re.compile(r"^\S+\.(svg|png|jpe?g|gif|pdf)$", re.IGNORECASE)


def alt_problem(alt: str | None) -> str | None:
    """Why ``alt`` does not describe a figure (missing, a file name, a few words), or None when it does."""
    if not alt or not alt.strip():
        return "has no alt text"
    if FILE_NAME.match(alt.strip()) or "/" in alt.split()[0]:
        return f"has a file name for alt text ({alt[:40]})"
    if len(alt.split()) < ALT_MIN_WORDS:
        return f"has an alt text of fewer than {ALT_MIN_WORDS} words ({alt[:40]})"
    return None


def figure_alt_text(app: Any, doctree: Any, docname: str) -> None:
    """doctree-resolved handler: every figure's image says in words what it shows (``:alt:``)."""
    for figure in doctree.findall(nodes.figure):
        for image in figure.findall(nodes.image):
            problem = alt_problem(image.get("alt"))
            if problem:
                LOG.warning(f"a figure {problem}: give its directive an :alt: that says what it shows", location=figure)


HELP_COLUMNS = "88"  # argparse wraps help to $COLUMNS: one width on every machine


def _literal(text: str, language: str = "text") -> nodes.literal_block:
    block = nodes.literal_block(text, text)
    block["language"] = language
    return block


def _section(title: str, ident: str, *children: nodes.Node) -> nodes.section:
    section = nodes.section(ids=[ident])
    section += nodes.title(title, title)
    for child in children:
        section += child
    return section


class CliHelp(SphinxDirective):
    """``.. attnid-cli::``: the help of ``attnid`` and of each subcommand, as the parser prints it."""

    def run(self) -> list[nodes.Node]:
        import argparse
        import os

        from attnid.cli import build_parser

        saved = os.environ.get("COLUMNS")
        os.environ["COLUMNS"] = HELP_COLUMNS
        try:
            parser = build_parser()
            found = [_section("attnid", "cli-attnid", _literal(parser.format_help()))]
            for action in parser._actions:  # argparse keeps the subcommands on its subparsers action
                if isinstance(action, argparse._SubParsersAction):
                    found += [_section(f"attnid {name}", f"cli-{name}", _literal(sub.format_help()))
                              for name, sub in action.choices.items()]
        finally:
            if saved is None:
                os.environ.pop("COLUMNS", None)
            else:
                os.environ["COLUMNS"] = saved
        return found


class JsonSchemas(SphinxDirective):
    """``.. attnid-json-schemas::``: the JSON Schema of each subcommand's ``--json`` output."""

    def run(self) -> list[nodes.Node]:
        import json

        from attnid.schemas import SCHEMAS

        return [_section(schema["title"], "json-" + name.replace(" ", "").replace("-", ""),
                         nodes.paragraph(text=schema["description"]),
                         _literal(json.dumps(schema, indent=2), "json"))
                for name, schema in SCHEMAS.items()]


def setup(app: Any) -> dict[str, Any]:
    app.add_directive("attnid-cli", CliHelp)
    app.add_directive("attnid-json-schemas", JsonSchemas)
    app.connect("doctree-resolved", typeset_glued_numbers)
    app.connect("doctree-resolved", figure_alt_text)
    app.connect("html-page-context", data_download)
    app.connect("config-inited", serve_vendor)
    app.connect("html-page-context", drop_thebe, priority=900)
    return {"parallel_read_safe": True, "parallel_write_safe": True, "version": "1"}
