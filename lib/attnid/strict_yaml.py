"""Reading a YAML file a user gives, trusting nothing in it (``attnid.census_file`` reads layouts with it).

The file is capped in size before parsing; the pure-Python safe loader refuses anchors and aliases (a
few hundred bytes of nested aliases expand to gigabytes), merge keys, duplicate keys and deep nesting,
and every failure is one ValueError naming the file, the line and the column.
"""

from __future__ import annotations
import datetime
import json
import math
from pathlib import Path
from typing import Any
import yaml
from attnid.fields import shown_path


MAX_FILE_BYTES = 2**20


MAX_DEPTH = 8  # nesting the schema needs: top level, models, entry, transformers_check, fields, plus slack


class Refused(yaml.MarkedYAMLError):
    """Valid YAML that a layout file may not use (anchors, aliases, merge keys, duplicate keys, deep nesting)."""


class StrictLoader(yaml.SafeLoader):
    """SafeLoader that refuses anchors, aliases, merge keys, duplicate keys and nesting deeper than MAX_DEPTH.

    Aliases are what make a billion-laughs file tiny on disk and huge once expanded; a layout file has no use for
    them, so they are refused when composed, before any value is built. The pure-Python loader is used on purpose:
    the C loader composes in C, out of reach of these checks.
    """

    _depth = 0

    def compose_node(self, parent, index):  # noqa: ANN001, ANN201 - PyYAML's signature
        event = self.peek_event()
        if isinstance(event, yaml.AliasEvent):
            raise Refused(None, None, f"alias *{event.anchor[:40]}: a layout file may not use anchors or aliases",
                           event.start_mark)
        if getattr(event, "anchor", None) is not None:
            raise Refused(None, None, f"anchor &{event.anchor[:40]}: a layout file may not use anchors or aliases",
                           event.start_mark)
        if self._depth >= MAX_DEPTH:
            raise Refused(None, None, f"nested deeper than {MAX_DEPTH} levels; a layout file needs at most 5",
                           event.start_mark)
        self._depth += 1
        try:
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def flatten_mapping(self, node):  # noqa: ANN001, ANN201
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                raise Refused(None, None, "merge key <<: a layout file may not use merge keys; write each field out",
                               key_node.start_mark)
        super().flatten_mapping(node)
        seen: set[Any] = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node)
            try:
                duplicate = key in seen
                seen.add(key)
            except TypeError:  # unhashable: construct_mapping says so, with its position
                continue
            if duplicate:
                raise Refused(None, None, f"duplicate key {quoted(key)}: each key may appear once in a mapping",
                               key_node.start_mark)

    def construct_object(self, node, deep=False):  # noqa: ANN001, ANN201
        try:
            return super().construct_object(node, deep)
        except (ValueError, TypeError, OverflowError) as exc:  # a date such as 2020-13-45, a 5000-digit integer
            why = str(exc).split(": ")[0]
            raise Refused(None, None, f"cannot read value {show(str(node.value))} ({why})", node.start_mark) from None


def show(value: Any) -> str:
    """A value as a short YAML-like phrase for an error message (never more than one line)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value) if abs(value) < 10**40 else "an integer of more than 40 digits"
    if isinstance(value, float):
        return ".nan" if value != value else (".inf" if value == math.inf else "-.inf" if value == -math.inf
                                               else repr(value))
    if isinstance(value, str):
        text = json.dumps(value)
        return text if len(text) <= 60 else text[:56] + '..."'
    names = {list: "a list", dict: "a mapping", bytes: "bytes", set: "a set", datetime.datetime: "a timestamp",
             datetime.date: "a date"}
    return names.get(type(value), f"a {type(value).__name__}")


def quoted(key: Any, limit: int = 60) -> str:
    """A key as Python quotes it ('m'), cut short so that a hostile key cannot make a long message."""
    text = repr(key) if isinstance(key, str) else show(key)
    return text if len(text) <= limit else text[:limit - 4] + "...'"


def place(path: Path | None, key: str | None = None, name: str | None = None) -> str:
    parts = [f"census file {shown_path(path)!r}"] if path is not None else []
    if key is not None:
        parts.append(f"layout {quoted(key)}")
    if name is not None:
        parts.append(f"field {quoted(name)}")
    return ", ".join(parts)


def read_yaml(path: Path) -> Any:
    """The one YAML document of ``path``, read with ``StrictLoader``; every failure a one-line ValueError."""
    where = place(path)
    try:
        if path.exists() and not path.is_file():  # a FIFO or a device would block or never end: regular files only
            what = "is a directory" if path.is_dir() else "not a regular file (a pipe or a device)"
            raise ValueError(f"{where}: cannot read: {what}")
        with path.open("rb") as handle:
            raw = handle.read(MAX_FILE_BYTES + 1)
    except OSError as exc:
        raise ValueError(f"{where}: cannot read: {exc.strerror or exc}") from None
    if len(raw) > MAX_FILE_BYTES:
        raise ValueError(f"{where}: larger than {MAX_FILE_BYTES} bytes, the limit for a layout file")
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = raw.count(b"\n", 0, exc.start) + 1
        column = exc.start - (raw.rfind(b"\n", 0, exc.start) + 1) + 1
        byte = raw[exc.start]
        raise ValueError(f"{where}: not UTF-8 text: byte 0x{byte:02x} at line {line}, column {column}") from None
    loader = None
    try:
        loader = StrictLoader(text)  # refuses a character YAML does not allow (NUL, most controls) right here
        return loader.get_single_data()
    except yaml.reader.ReaderError as exc:
        line = text.count("\n", 0, exc.position) + 1
        column = exc.position - (text.rfind("\n", 0, exc.position) + 1) + 1
        raise ValueError(f"{where}, line {line}, column {column}: not valid YAML: character #x{exc.character:04x} "
                         f"is not allowed") from None
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        at = f", line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        what = "; ".join(p for p in (exc.context, exc.problem) if p)[:300]
        kind = "" if isinstance(exc, Refused) else "not valid YAML: "
        raise ValueError(" ".join(f"{where}{at}: {kind}{what}".split())) from None
    except yaml.YAMLError as exc:
        raise ValueError(" ".join(f"{where}: not valid YAML: {exc}".split())) from None
    except RecursionError:
        raise ValueError(f"{where}: nested too deeply") from None
    finally:
        if loader is not None:
            loader.dispose()
