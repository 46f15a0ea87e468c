"""The table of tested clients in docs/clients.rst cannot drift from the tests and captures
it points at: every row names a test that exists, the version it gives is the one pinned
(setup.cfg or tests/clients/package-lock.json) and has a committed capture, and every committed
capture's client has a row."""

from __future__ import annotations

import ast
import configparser
import json
import re
from pathlib import Path

from tests.support.sink import all_captures, versions

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "clients.rst"
TESTS = ROOT / "tests"
#: Each row's client (how its first cell starts) -> its capture folder(s) under tests/clients and
#: where its version is pinned: ("pypi", distribution), ("npm", package) or None (installed by
#: hand, the page says how).
ROWS: dict[str, tuple[tuple[str, ...], tuple[str, str] | None]] = {
    "OpenAI Python SDK": (("openai-python",), ("pypi", "openai")),
    "OpenAI Node SDK": (("openai-node",), ("npm", "openai")),
    "ollama Python client": (("ollama-python",), ("pypi", "ollama")),
    "ollama JS client": (("ollama-js",), ("npm", "ollama")),
    "LangChain ``ChatOpenAI``": (("langchain-openai",), ("pypi", "langchain-openai")),
    "Anthropic Python SDK": (("anthropic-python",), ("pypi", "anthropic")),
    "Claude Code": (("claude-code",), ("npm", "@anthropic-ai/claude-code")),
    "Open WebUI": (("open-webui", "open-webui-ollama"), None),
}
HEADER = ["Client", "Version", "Routes it uses", "What Pharos does for it",
          "Test that proves it"]


def clients_table() -> list[list[str]]:
    """The rows of the list-table under the "Tested clients" heading, each a list of its
    cells' text (continuation lines joined by a space), the header row first."""
    lines = PAGE.read_text(encoding="utf-8").splitlines()
    start = lines.index("Tested clients")
    assert lines[start + 1].startswith("-------"), "Tested clients is not a section heading"
    at = next(i for i in range(start, len(lines)) if lines[i].startswith(".. list-table::"))
    rows: list[list[str]] = []
    for line in lines[at + 1:]:
        if line and not line.startswith(" "):
            break  # the table ended (a paragraph or a heading at the margin)
        if line.startswith("   * - "):
            rows.append([line[7:].strip()])
        elif line.startswith("     - "):
            rows[-1].append(line[7:].strip())
        elif line.startswith("       ") and rows:
            rows[-1][-1] += " " + line.strip()
    return rows


def defined_tests() -> set[str]:
    """The names of every test function under tests/ (not tests/clients/node_modules)."""
    names: set[str] = set()
    for path in TESTS.rglob("test_*.py"):
        if "node_modules" in path.parts:
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and \
                    node.name.startswith("test_"):
                names.add(node.name)
    return names


def named_tests(cell: str) -> list[tuple[str, str | None]]:
    """(test, parameter id or None) for each ````test_x````, ````test_x[id]```` and bare
    ````[id]```` (the previous test's) in a cell."""
    out: list[tuple[str, str | None]] = []
    for name, param in re.findall(r"``(test_\w+|)(?:\[([^\]]+)\])?``", cell):
        if not name:
            assert out, f"a bare parameter id before any test: {cell}"
            name = out[-1][0]
        out.append((name, param or None))
    return out


def row_client(row: list[str]) -> str:
    """The ``ROWS`` key a row's first cell starts with (fails naming an unknown client)."""
    key = next((k for k in ROWS if row[0].startswith(k)), None)
    assert key is not None, f"a row for a client the test does not know: {row[0]}"
    return key


def pinned(where: tuple[str, str]) -> str:
    """The version setup.cfg's test extra or tests/clients/package-lock.json pins."""
    kind, package = where
    if kind == "npm":
        lock = json.loads((TESTS / "clients" / "package-lock.json").read_text())
        return str(lock["packages"][f"node_modules/{package}"]["version"])
    cfg = configparser.ConfigParser()
    cfg.read(ROOT / "setup.cfg")
    for line in cfg["options.extras_require"]["test"].splitlines():
        name, sep, version = line.strip().partition("==")
        if sep and name.lower() == package.lower():
            return version.split(";")[0].strip()
    raise AssertionError(f"{package} is not pinned with == in setup.cfg's test extra")


def test_clients_table_has_its_columns_and_a_row_per_client() -> None:
    """The table's header is client, version, routes, what Pharos does, the test; each row is
    one of the known clients, once, and every client with a committed capture has a row."""
    header, *rows = clients_table()
    assert header == HEADER
    assert all(len(row) == len(HEADER) for row in rows), rows
    matched = [row_client(row) for row in rows]
    assert sorted(matched) == sorted(ROWS)
    covered = {c for folders, _ in ROWS.values() for c in folders}
    assert {client for client, _ in all_captures()} <= covered


def test_every_row_names_tests_that_exist() -> None:
    """Each row's last cell names at least one test, every one a test function under tests/;
    a parametrized replay names an existing capture (client-version)."""
    tests = defined_tests()
    replays = {f"{client}-{version}" for client, version in all_captures()}
    for row in clients_table()[1:]:
        named = named_tests(row[-1])
        assert named, f"{row[0]}: no test named"
        for name, param in named:
            assert name in tests, f"{row[0]}: {name} is not a test under tests/"
            if param is not None:
                assert name == "test_capture_replays" and param in replays, \
                    f"{row[0]}: {name}[{param}] does not exist"


def test_every_rows_version_is_pinned_and_captured() -> None:
    """Each row's version is the version pinned for the tests (a bump without the page
    fails) and has a committed capture in each of the client's capture folders."""
    for row in clients_table()[1:]:
        key = row_client(row)
        folders, where = ROWS[key]
        version = row[1]
        if where is not None:
            assert version == pinned(where), f"{key}: the page says {version}, pinned " \
                                             f"{pinned(where)}"
        for folder in folders:
            assert version in versions(folder), f"{key}: no capture {folder}/{version}"
