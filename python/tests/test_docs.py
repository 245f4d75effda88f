"""The Python example of docs/python.md runs as written, from the repository root, and prints
what the page says it prints."""

from __future__ import annotations

import contextlib
import io
import os
import re
from pathlib import Path

ROOT = Path(__file__).parents[2]
PAGE = ROOT / "docs" / "python.md"


def blocks(text: str) -> list[tuple[str, str]]:
    """The page's fenced blocks as (info string, text), in order."""
    return [(m.group(1), m.group(2)) for m in re.finditer(r"```(\w*)\n(.*?)```", text, re.S)]


def test_the_pbmc_example_prints_what_the_page_shows():
    found = blocks(PAGE.read_text())
    assert any(info == "python" for info, _ in found)
    namespace: dict = {}
    cwd = os.getcwd()
    os.chdir(ROOT)
    try:
        for n, (info, code) in enumerate(found):
            if info != "python":
                continue
            out = io.StringIO()
            with contextlib.redirect_stdout(out):
                exec(compile(code, f"{PAGE.name} block {n}", "exec"), namespace)
            # A ```text block right after a Python block is what that block prints.
            if n + 1 < len(found) and found[n + 1][0] == "text":
                assert out.getvalue() == found[n + 1][1], f"block {n} printed:\n{out.getvalue()}"
    finally:
        os.chdir(cwd)
