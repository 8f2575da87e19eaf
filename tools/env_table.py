"""Writes the environment-variable table of docs/environment.md from hybrid_ep.config.ENV_VARS.

    python tools/env_table.py          rewrite the table in docs/environment.md
    python tools/env_table.py --check  exit 1 when docs/environment.md is out of date (the tests do this)
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BEGIN = "| variable | default | meaning |\n|---|---|---|\n"


def render() -> str:
    sys.path.insert(0, str(ROOT / "python"))
    from hybrid_ep.config import ENV_VARS

    return BEGIN + "".join(f"| `{v.name}` | {v.default} | {v.meaning} |\n" for v in ENV_VARS)


def current(text: str) -> tuple[int, int]:
    start = text.index(BEGIN)
    end = start + len(BEGIN)
    while end < len(text) and text.startswith("| `", end):
        end = text.index("\n", end) + 1
    return start, end


def main() -> int:
    readme = ROOT / "docs" / "environment.md"
    text = readme.read_text()
    start, end = current(text)
    table = render()
    if "--check" in sys.argv:
        if text[start:end] != table:
            print("docs/environment.md's table is out of date: run python tools/env_table.py")
            return 1
        return 0
    readme.write_text(text[:start] + table + text[end:])
    return 0


if __name__ == "__main__":
    sys.exit(main())
