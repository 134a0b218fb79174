"""The READMEs' commands run as written: every `rec <command> ...` in a fenced shell block of
README.md, benchmarks/README.md and docs/deploy.md parses with the real click command (options,
choices, types; nothing runs), every `rec` flag quoted inline exists, every `make` target exists,
and every script a command runs exists and accepts the flags given to it."""

from __future__ import annotations

import importlib.util
import re
import shlex
from pathlib import Path

import click
import pytest

from rec.cli import main as rec_cli

ROOT = Path(__file__).resolve().parents[2]
DOCS = ("README.md", "benchmarks/README.md", "docs/deploy.md")
_SEPARATORS = {"&&", "||", ";", "|"}


def _words(text: str) -> list[str]:
    try:
        return shlex.split(text, comments=True)
    except ValueError:  # an unquoted apostrophe in a placeholder, e.g. <PyTorch's index>
        return text.split("#")[0].split()


def _simple_commands(doc: str) -> list[list[str]]:
    """The words of each simple command in the doc's ```bash blocks (continuations joined,
    comments dropped, split at && ; |)."""
    text = (ROOT / doc).read_text()
    commands = []
    for block in re.findall(r"```bash\n(.*?)```", text, re.S):
        for line in block.replace("\\\n", " ").splitlines():
            current: list[str] = []
            for word in _words(line):
                if word in _SEPARATORS:
                    commands.append(current)
                    current = []
                else:
                    current.append(word.strip("[]"))
            commands.append(current)
    return [c for c in commands if c]


def _inline_spans(doc: str) -> list[str]:
    text = re.sub(r"```.*?```", "", (ROOT / doc).read_text(), flags=re.S)
    return [" ".join(span.split()) for span in re.findall(r"`([^`]+)`", text)]


def _rec_calls(words: list[str]) -> list[tuple[str, list[str]]]:
    """(subcommand, its arguments) for each `rec <subcommand>` in words."""
    calls = []
    for i, word in enumerate(words[:-1]):
        if (word == "rec" or word.endswith("/rec")) and words[i + 1] in rec_cli.commands:
            calls.append((words[i + 1], words[i + 2 :]))
    return calls


def _flags(args: list[str]) -> list[str]:
    out = []
    for arg in args:
        if arg == "--":
            break
        if arg.startswith("-") and len(arg) > 1 and not arg[1].isdigit():
            out.append(arg.split("=", 1)[0])
    return out


def _fenced_rec_calls():
    return [
        pytest.param(sub, args, id=f"{doc}: rec {sub} {' '.join(args)}")
        for doc in DOCS
        for words in _simple_commands(doc)
        for sub, args in _rec_calls(words)
    ]


def test_the_readmes_have_rec_commands():
    assert len(_fenced_rec_calls()) >= 15


@pytest.mark.parametrize(("sub", "args"), _fenced_rec_calls())
def test_fenced_rec_command_parses(sub, args):
    command = rec_cli.commands[sub]
    try:
        command.make_context(f"rec {sub}", list(args))
    except click.ClickException as e:
        pytest.fail(f"rec {sub} {' '.join(args)}: {e.format_message()}")


def test_inline_rec_flags_exist():
    bad = []
    for doc in DOCS:
        for span in _inline_spans(doc):
            for sub, args in _rec_calls(_words(span)):
                known = {o for p in rec_cli.commands[sub].params for o in p.opts + p.secondary_opts}
                bad += [f"{doc}: `{span}`: {flag}" for flag in _flags(args) if flag not in known]
    assert not bad


def test_make_targets_exist():
    targets = set(re.findall(r"^([\w-]+):", (ROOT / "Makefile").read_text(), re.M))
    used = set()
    for doc in DOCS:
        for words in _simple_commands(doc):
            used |= {words[i + 1] for i, w in enumerate(words[:-1]) if w == "make"}
        used |= {m for span in _inline_spans(doc) for m in re.findall(r"^make ([\w-]+)", span)}
    assert {"demo", "test", "test-deploy"} <= used
    assert used <= targets, used - targets


def _script(words: list[str], i: int) -> Path | None:
    word = words[i]
    if word == "-m" and i + 1 < len(words) and words[i + 1].startswith("rec."):
        return Path(importlib.util.find_spec(words[i + 1]).origin)
    if re.fullmatch(r"[\w./-]+\.(py|sh)", word) and not word.startswith(("/", "<")):
        return ROOT / word
    return None


def test_scripts_exist_and_take_their_flags():
    bad, seen = [], 0
    for doc in DOCS:
        for words in _simple_commands(doc):
            for i in range(len(words)):
                script = _script(words, i)
                if script is None:
                    continue
                seen += 1
                if not script.is_file():
                    bad.append(f"{doc}: {script} does not exist")
                    continue
                if script.suffix == ".py":
                    source = script.read_text()
                    rest = words[i + 2 :] if words[i] == "-m" else words[i + 1 :]
                    bad += [
                        f"{doc}: {script.name} has no {flag}"
                        for flag in _flags(rest)
                        if f'"{flag}"' not in source
                    ]
                break
    assert seen >= 15
    assert not bad
