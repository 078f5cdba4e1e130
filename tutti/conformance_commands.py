r"""``tutti conformance run | provision``: replay the contract fixtures (CON-3, OPS-2).

``run`` replays fixture files against any implementation, given each server's address
and a bearer token per principal the fixtures authenticate as (``principals.yaml`` beside
them). ``provision`` makes those tokens for a local suite: it adds one token per
principal to a data directory's registry and prints the ``--token`` arguments, so::

    tutti conformance provision tests/contract/fixtures/principals.yaml \
        --data-dir /tmp/conformance > /tmp/conformance-tokens
    tutti up --data-dir /tmp/conformance &
    tutti conformance run tests/contract/fixtures/maintenance \
        --address maintenance=127.0.0.1:50054 $(cat /tmp/conformance-tokens)

Usage errors (a missing address or token, an unreadable fixture) print one line and exit 2.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, NoReturn

import typer
import yaml

__all__ = ["conformance_app"]

conformance_app = typer.Typer(no_args_is_help=True, help="Contract conformance fixtures (CON-3).")


def _usage_error(message: str) -> NoReturn:
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(2)


def _pairs(values: list[str], option: str) -> dict[str, str]:
    pairs = {}
    for value in values:
        key, sep, rest = value.partition("=")
        if not sep or not key or not rest:
            raise typer.BadParameter(f"{option} takes NAME=VALUE, got {value!r}")
        pairs[key] = rest
    return pairs


@conformance_app.command("run")
def conformance_run(
    fixtures: Annotated[list[Path], typer.Argument(help="Fixture files or directories.")],
    address: Annotated[
        list[str], typer.Option(help="SERVER=HOST:PORT for each server the fixtures name.")
    ],
    token: Annotated[
        list[str] | None,
        typer.Option(
            help="PRINCIPAL=TOKEN for each principal the fixtures use (principals.yaml); "
            "`tutti conformance provision` makes them for a local suite."
        ),
    ] = None,
) -> None:
    """Replay fixtures against a running implementation; exit 1 on any mismatch.

    Channels follow the TLS settings of the environment (``TUTTI_TLS_CA_FILE``...).
    """
    from conformance.runner import load_fixtures, replay
    from grpcserver.channels import sync_channel
    from grpcserver.settings import ServerSettings

    settings = ServerSettings()

    addresses = _pairs(address, "--address")
    tokens = _pairs(token or [], "--token")
    try:
        loaded = load_fixtures(fixtures)
    except (OSError, ValueError, KeyError, yaml.YAMLError) as error:
        _usage_error(f"cannot load the fixtures: {' '.join(str(error).split())}")
    if not loaded:
        _usage_error(f"no fixture files in {', '.join(map(str, fixtures))}")
    servers = sorted({name for f in loaded for name in (f.server, *f.backends)} - set(addresses))
    if servers:
        _usage_error(
            f"no --address for server(s) {', '.join(servers)}: pass --address NAME=HOST:PORT"
        )
    principals = sorted({name for f in loaded for name in f.principals} - set(tokens))
    if principals:
        _usage_error(
            f"no --token for principal(s) {', '.join(principals)}: pass --token NAME=TOKEN "
            "for each (`tutti conformance provision` makes them for a local `tutti up`)"
        )
    failed = 0
    for fixture in loaded:
        backends = {name: sync_channel(addresses[name], settings) for name in fixture.backends}
        try:
            with sync_channel(addresses[fixture.server], settings) as channel:
                report = replay(fixture, channel, tokens, backends=backends)
        finally:
            for backend in backends.values():
                backend.close()
        verdict = "ok" if not report.failures else f"{len(report.failures)} FAILED"
        typer.echo(f"{fixture.path}: {report.steps_run} steps, {verdict}")
        for failure in report.failures:
            typer.echo(f"  {failure}")
        failed += len(report.failures)
    raise typer.Exit(1 if failed else 0)


@conformance_app.command("provision")
def conformance_provision(
    principals_file: Annotated[
        Path, typer.Argument(help="The fixtures' principals.yaml (name: {role, workspaces}).")
    ],
    data_dir: Annotated[
        Path, typer.Option(help="Data directory of the suite to test (`tutti up --data-dir`).")
    ],
) -> None:
    """Add a token per principal to a data directory; print the `--token` arguments.

    Run it before `tutti up --data-dir DIR` (servers read the registry when they start).
    The tokens grant their principals' roles on that suite: use a throw-away directory.
    """
    from tutti.local_auth import ensure_principal_tokens

    try:
        document = yaml.safe_load(principals_file.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as error:
        _usage_error(f"cannot read {principals_file}: {' '.join(str(error).split())}")
    principals = document.get("principals") if isinstance(document, dict) else None
    if not isinstance(principals, dict) or not all(
        isinstance(spec, dict) for spec in principals.values()
    ):
        _usage_error(f"{principals_file}: expected 'principals: {{NAME: {{role, workspaces}}}}'")
    directory = data_dir.resolve()
    directory.mkdir(parents=True, exist_ok=True)
    try:
        tokens = ensure_principal_tokens(directory, principals)
    except ValueError as error:
        _usage_error(f"{principals_file}: {error}")
    for name, value in tokens.items():
        typer.echo(f"--token={name}={value}")
    typer.echo(
        f"{len(tokens)} principal token(s) in {directory / 'auth' / 'tokens.yaml'}; "
        f"(re)start `tutti up --data-dir {directory}` to accept them",
        err=True,
    )
