"""The ``tutti`` command line (OPS-2)."""

from __future__ import annotations

import asyncio
import enum
import importlib
from pathlib import Path
from types import ModuleType
from typing import Annotated

import typer
from pydantic import ValidationError
from sqlalchemy.engine import make_url

from grpcserver.settings import ServerSettings
from tutti.conformance_commands import conformance_app
from tutti.live_commands import live_app
from tutti.local_auth import ensure_local_credentials
from tutti.local_postgres import DatabaseUnavailable, ensure_database
from tutti.maintenance_commands import maintenance_app
from tutti.reference_commands import refdata_app, reference_app
from tutti.session_commands import ensure_local_workspace, session_app
from tutti.suite import COMPANIONS, DEFAULT_GRACE_SECONDS, SUITE, Suite, child_environment
from tutti.suite_record import remove_suite_record, write_suite_record
from tutti.supervision import StopRequested, StopSignals, follow_supervisor
from tutti.topology import DEFAULT_POSTGRES_URL, TopologyRefused, plan_topology

app = typer.Typer(no_args_is_help=True, help="Operate the Agent Activity Services suite.")
app.add_typer(reference_app, name="reference")
app.add_typer(refdata_app, name="refdata")
app.add_typer(session_app, name="session")
app.add_typer(live_app, name="live")
app.add_typer(maintenance_app, name="maintenance")


def _service_module(name: str) -> ModuleType:
    if name not in SUITE and name not in COMPANIONS:
        choices = ", ".join((*SUITE, *COMPANIONS))
        raise typer.BadParameter(f"unknown service {name!r}; choose one of {choices}")
    return importlib.import_module(f"services.{name}.app")


@app.command()
def serve(
    name: Annotated[str, typer.Argument(help=f"One of: {', '.join(SUITE)}.")],
    port_file: Annotated[
        Path | None, typer.Option(help="Write the bound port here once SERVING.")
    ] = None,
) -> None:
    """Run one service in the foreground until SIGTERM (what a pod runs)."""
    from grpcserver.app import RunningServer
    from grpcserver.app import serve as run

    follow_supervisor()  # under `tutti up`: never outlive it (OPS-3)
    module = _service_module(name)
    try:
        settings = module.Settings()
    except ValidationError as error:  # one line per invalid setting, no traceback
        for problem in error.errors():
            where = "".join(f"TUTTI_{part}: ".upper() for part in problem["loc"][:1])
            message = problem["msg"].removeprefix("Value error, ")
            typer.echo(f"tutti serve {name}: invalid settings: {where}{message}", err=True)
        raise typer.Exit(2) from None

    def ready(running: RunningServer) -> None:
        if port_file is not None:
            tmp = port_file.with_suffix(".tmp")
            tmp.write_text(f"{running.port}\n")
            tmp.replace(port_file)

    raise typer.Exit(asyncio.run(run(module.build(settings), settings, ready=ready)))


@app.command()
def migrate(
    database_url: Annotated[
        str | None, typer.Option(help="SQLAlchemy URL; default: TUTTI_DATABASE_URL or SQLite.")
    ] = None,
) -> None:
    """Upgrade the canonical store schema to the newest revision."""
    from store.migrate import upgrade

    url = database_url or ServerSettings().resolved_database_url()
    if url.startswith("sqlite:///"):
        Path(url.removeprefix("sqlite:///")).parent.mkdir(parents=True, exist_ok=True)
    upgrade(url)
    typer.echo(f"schema at head: {_redact(url)}")


class StoreChoice(enum.StrEnum):
    """``tutti up --store``."""

    SQLITE = "sqlite"
    POSTGRES = "postgres"


class BusChoice(enum.StrEnum):
    """``tutti up --bus``."""

    INPROCESS = "inprocess"
    NATS = "nats"


def _redact(url: str) -> str:
    scheme, sep, rest = url.partition("://")
    if "@" in rest:
        rest = "***@" + rest.split("@", 1)[1]
    return f"{scheme}{sep}{rest}"


@app.command()
def up(
    data_dir: Annotated[
        Path | None, typer.Option(help="Data directory; default: TUTTI_DATA_DIR.")
    ] = None,
    base_port: Annotated[
        int, typer.Option(help="Port of host; the others follow (+1 ...). 0 picks free ports.")
    ] = 50051,
    grace: Annotated[
        float,
        typer.Option(
            min=1.0, help="Seconds a stop waits for the services to drain before killing them."
        ),
    ] = DEFAULT_GRACE_SECONDS,
    replicas: Annotated[
        int,
        typer.Option(
            help="Host and livestream replicas (replica i at +10*(i-1) ports); more than one "
            "needs --store postgres --bus nats, and runs two maintenance replicas."
        ),
    ] = 1,
    store: Annotated[
        StoreChoice | None,
        typer.Option(help="sqlite or postgres; default: what TUTTI_DATABASE_URL names (SQLite)."),
    ] = None,
    bus: Annotated[
        BusChoice | None,
        typer.Option(
            help="nats: start the project's nats-server (JetStream) as the cross-replica live "
            "log; default: the in-process live log."
        ),
    ] = None,
    database_url: Annotated[
        str | None,
        typer.Option(
            help="Postgres URL for --store postgres; default: TUTTI_DATABASE_URL, else "
            f"{DEFAULT_POSTGRES_URL} (created when missing)."
        ),
    ] = None,
) -> None:
    """Start the whole suite on this machine (SQLite by default) until Ctrl-C or SIGTERM.

    The first Ctrl-C (or SIGTERM, SIGHUP) drains every service within the grace and exits 0
    after a clean stop; a second one kills them at once. No service outlives this command,
    not even after ``kill -9`` of it (OPS-3). ``--replicas N --store postgres --bus nats``
    runs N Host and N livestream replicas and nats-server on one Postgres database (SCALE-6).
    """
    # First of all, whatever dispositions this process inherited (SIGINT is ignored in a
    # background job of a non-interactive shell): a stop must always be possible.
    signals = StopSignals()
    signals.install()
    defaults = ServerSettings()
    directory = (data_dir or defaults.data_dir).resolve()
    settings = ServerSettings(data_dir=directory)
    try:  # refused before anything is created
        topology = plan_topology(
            replicas=replicas,
            store=store.value if store is not None else None,
            bus=bus.value if bus is not None else None,
            database_url=database_url,
            configured_url=settings.database_url,
            sqlite_url=settings.resolved_database_url(),
        )
    except TopologyRefused as error:
        typer.echo(f"tutti up: {error}", err=True)
        raise typer.Exit(2) from None
    directory.mkdir(parents=True, exist_ok=True)
    credentials = ensure_local_credentials(directory)
    ensure_local_workspace(directory)  # the CLI's default workspace (`tutti session ...`)
    url = topology.database_url
    typer.echo(f"data directory: {directory}")
    if topology.create_database:
        try:
            created = ensure_database(url)
        except DatabaseUnavailable as error:
            typer.echo(f"suite failed to start: {error}", err=True)
            raise typer.Exit(1) from None
        shown = make_url(url).render_as_string(hide_password=True)
        typer.echo(f"database: {shown}{' (created)' if created else ''}")
    migrate(url)
    suite = Suite(
        data_dir=directory,
        base_port=base_port,
        env=child_environment(
            data_dir=directory,
            service_token=credentials.service_token,
            tokens_file=credentials.tokens_file,
            database_url=url,
        ),
        log=typer.echo,
        signals=signals,
        grace_period_seconds=grace,
        topology=topology if topology.replicas > 1 or topology.nats_server else None,
    )
    code = 0
    try:
        typer.echo("starting services ...")
        addresses = suite.start()
        # The CLI's record: each process, and each service name at its first replica.
        record = {service: addresses[suite.process_names(service)[0]] for service in SUITE}
        write_suite_record(directory, {**addresses, **record}, log=typer.echo)
        typer.echo(
            "suite ready. Token for the CLI and grpcurl: "
            f"{credentials.tokens_file.parent / 'cli-token'}\n"
            f'  try: grpcurl -plaintext -H "authorization: Bearer $(cat '
            f'{credentials.tokens_file.parent / "cli-token"})" {record["host"]} list\n'
            "Press Ctrl-C to stop."
        )
        exited = suite.wait()
        if exited is not None:
            typer.echo(f"{exited} exited unexpectedly; stopping the suite", err=True)
            code = 1
    except StopRequested:
        pass
    except (RuntimeError, TimeoutError) as error:
        typer.echo(f"suite failed to start: {error}", err=True)
        code = 1
    finally:
        if signals.requested.is_set():
            typer.echo(f"stopping ({signals.received}) ...")
        remove_suite_record()  # only if it names this suite (tutti/suite_record.py)
        report = suite.stop()
    typer.echo("stopped" if report.clean else f"stopped (exit codes: {report.exit_codes})")
    raise typer.Exit(code or (0 if report.clean else 1))


app.add_typer(conformance_app, name="conformance")


admin_app = typer.Typer(no_args_is_help=True, help="Store administration and data migration.")
app.add_typer(admin_app, name="admin")


@admin_app.command("mark-legacy-tombstones")
def mark_legacy_tombstones(
    workspace: Annotated[str, typer.Option(help="Workspace of the Sessions.")],
    session: Annotated[list[str], typer.Option(help="A Session id to mark (repeatable).")],
    deleted_at_unix_ms: Annotated[int, typer.Option(help="Deletion time to record.")],
    database_url: Annotated[
        str | None, typer.Option(help="SQLAlchemy URL; default: TUTTI_DATABASE_URL or SQLite.")
    ] = None,
) -> None:
    """Import lossy tombstones of the older delete: restorable never, purgeable manually."""
    from store.engine import create_sync_engine_for
    from store.legacy_tombstones import mark_legacy_tombstones as mark

    url = database_url or ServerSettings().resolved_database_url()
    engine = create_sync_engine_for(url)
    try:
        marked = mark(engine, workspace, session, deleted_at_unix_ms)
    finally:
        engine.dispose()
    typer.echo(f"marked {marked} legacy tombstone(s) in {workspace}")


def main() -> None:
    """Console-script entry point."""
    app()
