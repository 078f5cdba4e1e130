"""Generate the authorization table of docs/auth.md from the services' declarations (SEC-3).

    python scripts/auth_table.py           # rewrite the table in docs/auth.md
    python scripts/auth_table.py --check   # fail if docs/auth.md is out of date

The table sits between the ``authorization-table`` markers of docs/auth.md; each row is
one RPC of a served service with its declared roles and workspace source, read from
``services/<name>/authorization.py`` (an undeclared RPC shows as such).
"""

from __future__ import annotations

import argparse
import importlib
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "auth.md"
BEGIN = "<!-- authorization-table:begin -->"
END = "<!-- authorization-table:end -->"

if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


def render() -> str:
    """The generated table, markers included."""
    from grpcserver.authorization import render_table
    from tutti.suite import SUITE

    tables = [
        (name, importlib.import_module(f"services.{name}.authorization").AUTHORIZATION)
        for name in SUITE
    ]
    return f"{BEGIN}\n{render_table(tables)}{END}"


def updated(text: str) -> str:
    """``text`` (docs/auth.md) with the table between the markers regenerated.

    Raises:
        ValueError: The markers are missing or out of order.
    """
    start, end = text.find(BEGIN), text.find(END)
    if start < 0 or end < start:
        raise ValueError(f"{DOC.name}: expected {BEGIN!r} followed by {END!r}")
    return text[:start] + render() + text[end + len(END) :]


def main() -> int:
    """Rewrite or check docs/auth.md."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true")
    options = parser.parse_args()
    current = DOC.read_text(encoding="utf-8")
    try:
        wanted = updated(current)
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    if options.check:
        if wanted != current:
            print(
                "docs/auth.md's authorization table is out of date: "
                "run python scripts/auth_table.py",
                file=sys.stderr,
            )
            return 1
        print("docs/auth.md authorization table up to date")
        return 0
    DOC.write_text(wanted, encoding="utf-8")
    print(f"wrote {DOC.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
