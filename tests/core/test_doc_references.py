"""Every file path that the code, the READMEs and the docs cite is in the repository (#49 item 7).

A comment such as "(see rec/contract/io.py)" or a link such as "docs/architecture.md#model-io"
is a promise to the reader; a moved or renamed file breaks it silently. This test finds such
paths in every file of the checkout and fails on each one that does not resolve, naming
file:line. A link into a Markdown file with a #section must name one of its headings. The
design notes a path once pointed to outside the repository are cited nowhere: a user who
clones rec cannot follow them.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

from rec.contract import FORMATS, MANIFEST_FILE, TRITON_CONFIG_FILE

REPO = Path(__file__).resolve().parents[2]

SCANNED = {".py", ".md", ".cpp", ".h", ".sh", ".yaml", ".yml", ".toml", ".txt", ".cfg"}
SCANNED_NAMES = {"Makefile", "CMakeLists.txt", "Dockerfile"}
TOP = "docs|rec|train|export|serve|cpp|tests|scripts|benchmarks|examples|deploy"
EXTENSIONS = "py|md|cpp|h|json|yaml|sh|txt|proto|pbtxt"
# A path starts a word (or follows "../" in a relative link), stops at its extension, and may
# carry a #section. Placeholders (<model>, *, {name}) cannot match: the characters of a path
# are word characters, dots, slashes and dashes only.
PATH = re.compile(
    rf"(?<![\w./-])((?:\.\./)*(?:{TOP})/[\w./-]*?\.(?:{EXTENSIONS}))(?![\w-])(?:#([\w-]+))?"
)
# The setuptools mapping in pyproject.toml: rec.train is train/, and so on.
MAPPED = {"rec/train/": "train/", "rec/export/": "export/", "rec/serve/": "serve/"}
OUTSIDE = re.compile(r"\bDESIGN" + r"\.md\b")  # spelled in two parts, so this file passes
# A model repository's own files (rec/1/rec.json: the model named rec) are not this repository's.
MODEL_FILES = {MANIFEST_FILE, TRITON_CONFIG_FILE, *(spec.file for spec in FORMATS.values())}


def checkout_files() -> list[Path]:
    """Tracked files and new ones not ignored; without git, every file but the build's."""
    try:
        out = subprocess.run(
            ["git", "ls-files", "--cached", "--others", "--exclude-standard"],
            cwd=REPO, capture_output=True, text=True, check=True,
        ).stdout  # fmt: skip
        paths = [REPO / line for line in out.splitlines()]
    except (OSError, subprocess.CalledProcessError):
        skip = {".git", ".venv", "build", "node_modules", "__pycache__"}
        paths = [p for p in REPO.rglob("*") if not skip & set(p.relative_to(REPO).parts)]
    return sorted(
        p for p in paths
        if p.is_file() and (p.suffix in SCANNED or p.name in SCANNED_NAMES)
    )  # fmt: skip


def resolve(cited: str, source: Path) -> Path | None:
    """The file `cited` names: from the repository's root, from the citing file's folder (a
    relative link, cpp/'s own tests/ in cpp/CMakeLists.txt) or its top-level folder; None if
    none of them exists."""
    bare = cited
    while bare.startswith("../"):
        bare = bare[3:]
    for prefix, folder in MAPPED.items():
        if bare.startswith(prefix):
            bare = folder + bare[len(prefix) :]
    top = REPO / source.relative_to(REPO).parts[0]
    for candidate in (REPO / bare, source.parent / cited, top / bare):
        if candidate.is_file():
            return candidate
    return None


def anchors(markdown: Path) -> set[str]:
    """The #section names of a Markdown file's headings, as GitHub makes them."""
    out = set()
    for line in markdown.read_text(encoding="utf-8").splitlines():
        if line.startswith("#"):
            title = line.lstrip("#").strip().lower()
            out.add(re.sub(r"\s", "-", re.sub(r"[^\w\- ]", "", title)))
    return out


def broken_references() -> list[str]:
    broken = []
    for source in checkout_files():
        if source == Path(__file__).resolve():  # its own examples of broken paths
            continue
        try:
            text = source.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue
        where = source.relative_to(REPO)
        for number, line in enumerate(text.splitlines(), 1):
            if OUTSIDE.search(line):
                broken.append(f"{where}:{number}: cites a design file outside the repository")
            for match in PATH.finditer(line):
                cited, section = match.groups()
                target = resolve(cited, source)
                if target is None and Path(cited).name in MODEL_FILES:
                    continue
                if target is None:
                    broken.append(f"{where}:{number}: {cited} does not exist")
                elif section and target.suffix == ".md" and section not in anchors(target):
                    broken.append(f"{where}:{number}: {cited} has no section #{section}")
    return broken


def test_every_cited_path_exists():
    broken = broken_references()
    assert not broken, "cited paths that are not in the repository:\n" + "\n".join(broken)


def test_the_scan_finds_paths_and_sections(tmp_path):
    """The pattern itself: what it takes for a path, and what it leaves alone."""
    line = (
        "see rec/contract/io.py, (../docs/architecture.md#model-io), rec/serve/triton.py:10, "
        "<repo>/<model>/rec.json, tests/*/conftest.py, benchmarks/results/{name}.json, "
        "/abs/cpp/src/x.cpp, cpp/src/model/request.h."
    )
    found = [m.groups() for m in PATH.finditer(line)]
    assert found == [
        ("rec/contract/io.py", None),
        ("../docs/architecture.md", "model-io"),
        ("rec/serve/triton.py", None),
        ("cpp/src/model/request.h", None),
    ]
    docs = REPO / "docs" / "architecture.md"
    assert resolve("rec/serve/triton.py", docs) == REPO / "serve" / "triton.py"
    assert resolve("../docs/architecture.md", REPO / "serve" / "README.md") == docs
    assert resolve("tests/no_such_test.py", docs) is None
    assert {"model-io", "pinned-stack", "run-directory"} <= anchors(docs)
