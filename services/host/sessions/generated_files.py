"""``SearchGeneratedFiles``: one rail section's generated files (HOST-SES-8).

Host keeps no generated-file projection and never scans messages. It reads the frozen
file-change snapshots (HOST-TURN-8) of a bounded window of the most recently settled Turns of
the live Sessions whose persisted ``rail_section_key`` equals the requested key exactly, and
combines them here: one entry per path, decided by the latest settled Turn that names it. A
path that Turn deleted is omitted, and so is the old path of a rename (the file no longer
exists there). ``section_key`` is required: there is no fallback to a cwd, a path or every
section.
"""

from __future__ import annotations

from dataclasses import dataclass

from domainerrors import FieldViolation, InvalidArgument
from services.host.context import HostContext
from services.host.model.file_changes import decode_file_changes
from services.host.repository.turn_rows import SettledSnapshot
from services.host.repository.unit_of_work import HostTransaction
from services.host.sessions.projects import validate_section_key

__all__ = [
    "DEFAULT_LIMIT",
    "MAX_LIMIT",
    "MAX_QUERY_CHARS",
    "SNAPSHOT_WINDOW",
    "GeneratedFile",
    "GeneratedFileSearch",
    "combine",
    "search_generated_files",
]

SNAPSHOT_WINDOW = 500
"""How many of the section's most recently settled Turns with a snapshot are read."""
DEFAULT_LIMIT = 100
MAX_LIMIT = 1000
MAX_QUERY_CHARS = 1024


@dataclass(frozen=True)
class GeneratedFileSearch:
    """A validated-to-be ``SearchGeneratedFiles`` request; ``None`` means unset."""

    workspace_id: str
    section_key: str
    query: str | None = None
    limit: int | None = None


@dataclass(frozen=True)
class GeneratedFile:
    """One path's latest state in the section, and the Turn that decided it."""

    path: str
    change: str
    previous_path: str | None
    session_id: str
    turn_id: str
    settled_at_unix_ms: int


def _validate(search: GeneratedFileSearch) -> None:
    violations: list[FieldViolation] = []
    if (violation := validate_section_key(search.section_key, "section_key")) is not None:
        violations.append(violation)
    if search.limit is not None and not 1 <= search.limit <= MAX_LIMIT:
        violations.append(FieldViolation("limit", f"must be between 1 and {MAX_LIMIT}"))
    if search.query is not None and len(search.query) > MAX_QUERY_CHARS:
        violations.append(FieldViolation("query", f"must be at most {MAX_QUERY_CHARS} characters"))
    if violations:
        first = violations[0]
        raise InvalidArgument(
            f"invalid SearchGeneratedFiles: {first.field} {first.description}",
            field_violations=violations,
        )


def combine(snapshots: list[SettledSnapshot]) -> list[GeneratedFile]:
    """One entry per path from snapshots ordered newest first; deleted paths omitted.

    Returns:
        The entries newest first (ties by path).
    """
    decided: set[str] = set()
    files: list[GeneratedFile] = []
    for snapshot in snapshots:
        entries = decode_file_changes(snapshot.file_changes_json)
        for entry in entries:
            if entry.path in decided:
                continue
            decided.add(entry.path)
            if entry.change == "deleted" or entry.change is None:
                continue
            files.append(
                GeneratedFile(
                    path=entry.path,
                    change=entry.change,
                    previous_path=entry.previous_path,
                    session_id=snapshot.session_id,
                    turn_id=snapshot.turn_id,
                    settled_at_unix_ms=snapshot.settled_at_unix_ms,
                )
            )
        # A rename's old path is gone as of this Turn, unless a newer Turn or this one named it.
        decided.update(entry.previous_path for entry in entries if entry.previous_path)
    files.sort(key=lambda f: (-f.settled_at_unix_ms, f.path))
    return files


async def search_generated_files(
    ctx: HostContext, search: GeneratedFileSearch
) -> list[GeneratedFile]:
    """The section's generated files, filtered and bounded (HOST-SES-8).

    Raises:
        InvalidArgument: a missing or blank ``section_key``, a ``limit`` outside 1..1000, an
            oversized ``query``.
    """
    _validate(search)

    async def run(repos: HostTransaction) -> list[SettledSnapshot]:
        return await repos.turns.settled_snapshots_of_section(
            search.workspace_id, search.section_key, SNAPSHOT_WINDOW
        )

    files = combine(await ctx.transact(run, write=False))
    if search.query:
        needle = search.query.casefold()
        files = [f for f in files if needle in f.path.casefold()]
    return files[: search.limit or DEFAULT_LIMIT]
