"""The configuration reference (docs/config.md) and a complete example config, both made from
the dataclasses of rec.config and the docstring under each of their fields.

A field's docstring is its documentation: the text, then optionally a paragraph that starts
with `Example:` and holds YAML for the field's value (inline, or indented on the lines after).
Nothing here restates a field: a new field, default or docstring reaches both outputs.

    rec config --doc > docs/config.md     # tests/core/test_config_doc.py checks it is current
    rec config --example > my.yaml        # every key at its default, for `rec train -c my.yaml`
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import re
import textwrap
import typing
from dataclasses import dataclass
from typing import Any

import click
import yaml

from rec import config as config_module
from rec.config import RecConfig

REGENERATE = "rec config --doc > docs/config.md"
_EXAMPLE = re.compile(r"^Example:[ \t]*", re.M)
# A sentence ends at a period before a space (not at "e.g.", "i.e." or "...").
_SENTENCE_END = re.compile(r"(?<!e\.g)(?<!i\.e)(?<!\.\.)\.(?=\s)")


@dataclass(frozen=True)
class FieldDoc:
    """One key of the YAML file."""

    path: str  # tables[].name, sharding.constraints.<name>.sharding_types
    name: str
    type: Any
    default: Any  # dataclasses.MISSING for a required key
    text: str  # the docstring without its example
    example: str | None  # YAML of the value, as the docstring writes it


@dataclass(frozen=True)
class Section:
    """A mapping of the YAML file: the top level's sections and those nested in them."""

    path: str  # "" for the top level; tables[], data.columns, sharding.constraints.<name>
    cls: type
    text: str
    fields: list[FieldDoc]


def docstrings(cls: type) -> dict[str, str]:
    """Field name -> the string literal that follows the field in `cls`'s source."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    body = tree.body[0].body
    out = {}
    for node, after in zip(body, body[1:], strict=False):
        if (
            isinstance(node, ast.AnnAssign)
            and isinstance(node.target, ast.Name)
            and isinstance(after, ast.Expr)
            and isinstance(after.value, ast.Constant)
            and isinstance(after.value.value, str)
        ):
            out[node.target.id] = inspect.cleandoc(after.value.value)
    return out


def split_example(doc: str) -> tuple[str, str | None]:
    """(text, example YAML or None) of a field's docstring."""
    match = _EXAMPLE.search(doc)
    if match is None:
        return doc, None
    first, _, rest = doc[match.end() :].partition("\n")
    example = first.strip() if first.strip() else textwrap.dedent(rest).strip()
    return doc[: match.start()].strip(), example


def _default(f: dataclasses.Field) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return dataclasses.MISSING


def _nested(tp: Any) -> tuple[type, str] | None:
    """(dataclass, path suffix) when a field of type `tp` is a mapping of its own."""
    if dataclasses.is_dataclass(tp):
        return tp, ""
    args = typing.get_args(tp)
    optional = [a for a in args if dataclasses.is_dataclass(a)]
    if optional and type(None) in args:  # an optional section (TableConfig.ids.zch)
        return optional[0], ""
    if typing.get_origin(tp) is list and dataclasses.is_dataclass(args[0]):
        return args[0], "[]"
    if typing.get_origin(tp) is dict and dataclasses.is_dataclass(args[1]):
        return args[1], ".<name>"
    return None


def sections(cls: type = RecConfig, path: str = "", text: str = "") -> list[Section]:
    """`cls`'s section, then its nested sections, depth first (the order of the file)."""
    hints = typing.get_type_hints(cls)
    docs = docstrings(cls)
    fields, nested = [], []
    for f in dataclasses.fields(cls):
        where = f"{path}.{f.name}" if path else f.name
        inner = _nested(hints[f.name])
        if inner is not None:
            # A mapping keyed by name documents itself as a key of this section; a section or
            # a list of them only as its heading.
            own = split_example(docs.get(f.name, ""))[0] if inner[1] != ".<name>" else ""
            body = "\n\n".join(s for s in (own, inspect.cleandoc(inner[0].__doc__ or "")) if s)
            nested.append((inner[0], where + inner[1], body))
            if inner[1] == "":
                continue  # a plain section is its own heading, not a key of this one
        field_text, example = split_example(docs.get(f.name, ""))
        fields.append(FieldDoc(where, f.name, hints[f.name], _default(f), field_text, example))
    out = [Section(path, cls, text or inspect.cleandoc(cls.__doc__ or ""), fields)]
    for inner_cls, inner_path, inner_text in nested:
        out += sections(inner_cls, inner_path, inner_text)
    return out


def type_name(tp: Any) -> str:
    """`tp` as the reference shows it: int, list[str], dict[str, mapping], ..."""
    args = typing.get_args(tp)
    if dataclasses.is_dataclass(tp):
        return "mapping"
    if typing.get_origin(tp) is list:
        return f"list[{type_name(args[0])}]"
    if typing.get_origin(tp) is dict:
        return f"dict[{type_name(args[0])}, {type_name(args[1])}]"
    return "any" if tp is Any else tp.__name__


def flow(value: Any) -> str:
    """`value` as one line of YAML."""
    text = yaml.safe_dump(value, default_flow_style=True, width=10**6, sort_keys=False)
    return text.removesuffix("\n...\n").strip()


def example_snippet(f: FieldDoc) -> str:
    """The field set to its example (else its default), nested under its sections' keys up to
    the first `<name>` placeholder, as YAML a config file could hold."""
    value = f.example if f.example is not None else flow(f.default)
    lines = (
        [f"{f.name}: {value}"]
        if "\n" not in value
        else [f"{f.name}:"] + ["  " + line for line in value.splitlines()]
    )
    parts = f.path.split(".")[:-1]
    if "<name>" in parts:
        return "\n".join(lines)
    for part in reversed(parts):
        if part.endswith("[]"):  # an item of a list: "- " on its first line
            lines = [f"{part[:-2]}:", "- " + lines[0]] + ["  " + line for line in lines[1:]]
        else:
            lines = [f"{part}:"] + ["  " + line for line in lines]
    return "\n".join(lines)


def replaced_whole() -> list[str]:
    """Paths of the mappings a file gives whole rather than merged with the default's."""
    return [
        f.path
        for s in sections()
        for f in s.fields
        if f.name in config_module._REPLACE_KEYS and typing.get_origin(f.type) is dict
    ]


def _anchor(path: str) -> str:
    """GitHub's anchor of a heading `path` in backticks."""
    return re.sub(r"[^\w\- ]", "", path.lower())


def _link(path: str) -> str:
    return f"[`{path}`](#{_anchor(path)})"


def _and(items: list[str]) -> str:
    return ", ".join(items[:-1]) + " and " + items[-1] if len(items) > 1 else "".join(items)


def _intro() -> list[str]:
    replaced = _and([f"`{p}`" for p in replaced_whole()])
    paragraphs = [
        f"Generated from the docstrings of `rec/config.py` by `{REGENERATE}`: edit those, not "
        "this file (`tests/core/test_config_doc.py` fails when the two disagree).",
        "`rec train -c FILE` and `rec plan -c FILE` read one YAML file laid over the embedded "
        "default (a small DLRM on synthetic data): a key the file leaves out keeps the default "
        f"shown here. A file that lists `tables` replaces the default's tables whole, and so "
        f"do {replaced}; other mappings are merged key by key. An unknown key or a bad value is "
        "refused with its path and what is allowed. A run saves the config it trained with as "
        "`config.yaml` in its run directory.",
        "`rec config --example` prints a complete config to start from: every key at its "
        "default, its summary and an example as comments.",
        f"Sections: {_and([_link(s.path) for s in sections()[1:]])}.",
    ]
    lines = ["# Configuration reference"]
    for text in paragraphs:
        lines += ["", *textwrap.wrap(text, 100, break_on_hyphens=False, break_long_words=False)]
    return lines


def _field_markdown(f: FieldDoc) -> list[str]:
    default = "required" if f.default is dataclasses.MISSING else f"default `{flow(f.default)}`"
    kind = f"`{type_name(f.type)}`"
    if (_nested(f.type) or (None, ""))[1] == ".<name>":  # a mapping from name to a section
        kind += f" (each value: the keys of {_link(f.path + '.<name>')})"
    lines = ["", f"### `{f.path}`", "", f"{kind}, {default}."]
    if f.text:
        lines += ["", f.text]
    return lines + ["", "```yaml", example_snippet(f), "```"]


def markdown() -> str:
    """docs/config.md."""
    lines = _intro()
    for section in sections()[1:]:
        lines += ["", f"## `{section.path}`", "", section.text]
        for f in section.fields:
            lines += _field_markdown(f)
    return "\n".join(lines) + "\n"


def _comment(text: str, indent: str) -> list[str]:
    return [indent + "# " + line for line in textwrap.wrap(text, 96 - len(indent))]


def _summary(text: str) -> str:
    """The first sentence of `text`, on one line."""
    flat = " ".join(text.split())
    end = _SENTENCE_END.search(flat)
    return flat[: end.end()] if end else flat


def _example_key(f: FieldDoc, value: Any, indent: str) -> list[str]:
    """A key at `value`, above it its summary and its docstring's example, commented."""
    lines = _comment(_summary(f.text), indent)
    shown = [] if f.example in (None, flow(value)) else f.example.splitlines()
    if len(shown) == 1:
        lines.append(f"{indent}#   e.g. {shown[0]}")
    elif shown:
        lines += [f"{indent}#   e.g.:"] + [f"{indent}#     {line}" for line in shown]
    return lines + [f"{indent}{f.name}: {flow(value)}"]


def _example_section(by_path: dict[str, Section], path: str, indent: str) -> list[str]:
    """The keys of section `path` at their defaults, then its nested sections (not those keyed
    by name, whose default is empty)."""
    lines = []
    for f in by_path[path].fields:
        lines += _example_key(f, f.default, indent)
    for inner in by_path.values():
        head, _, name = inner.path.rpartition(".")
        if head == path and inner.path != path and name.isidentifier():
            lines += ["", *_comment(_summary(inner.text), indent), f"{indent}{name}:"]
            lines += _example_section(by_path, inner.path, indent + "  ")
    return lines


def example_yaml() -> str:
    """A complete config: every key at its default, its summary as a comment. It loads to
    the default config, so a user edits what they change and may delete the rest."""
    by_path = {s.path: s for s in sections()}
    tables = by_path["tables[]"]
    lines = [
        "# A complete rec config: every key at its default (`rec config --example`). Keys left",
        "# out of a file take these defaults; docs/config.md describes each one.",
        "",
        *_comment(_summary(tables.text), ""),
        "tables:",
    ]
    ids = by_path["tables[].ids"]
    for i, table in enumerate(config_module.default_config_dict()["tables"]):
        values = {f.name: table.get(f.name, f.default) for f in tables.fields}
        values["ids"] = table.get("ids", "modulo")
        if i == 0:  # the first table carries the comments; the others are one line each
            body = [ln for f in tables.fields for ln in _example_key(f, values[f.name], "  ")]
            body += _comment(_summary(ids.text), "  ") + [f"  ids: {flow(values['ids'])}"]
            lines += ["- " + body[0].lstrip()] + body[1:]
        else:
            lines.append(f"- {flow(values)}")
    for section in by_path.values():
        if section.path.isidentifier():  # a top-level section but tables
            lines += ["", *_comment(_summary(section.text), ""), f"{section.path}:"]
            lines += _example_section(by_path, section.path, "  ")
    return "\n".join(lines) + "\n"


@click.command("config")
@click.option(
    "--example",
    "what",
    flag_value="example",
    help="A complete, commented YAML config at the defaults, for `rec train -c`.",
)
@click.option("--doc", "what", flag_value="doc",
              help="The Markdown reference of every key (docs/config.md).")  # fmt: skip
def config_command(what: str | None) -> None:
    """Print a complete example config (--example) or the configuration reference (--doc)."""
    if what is None:
        raise click.UsageError("choose --example (a YAML config) or --doc (the reference)")
    click.echo(example_yaml() if what == "example" else markdown(), nl=False)


COMMANDS = [config_command]
