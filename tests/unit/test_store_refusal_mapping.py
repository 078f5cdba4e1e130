"""A write the store refused reaches the caller typed, never as INTERNAL (SEC-4).

Whatever RPC lets a constraint violation or an unstorable value escape its handler, the
interceptor answers ``FAILED_PRECONDITION`` (``STORE_CONSTRAINT_VIOLATION`` naming the
constraint, or ``STORE_VALUE_REJECTED``) and logs a WARNING, not an ERROR traceback.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, cast

import grpc
import pytest
from google.rpc import code_pb2, error_details_pb2, status_pb2
from sqlalchemy import Column, Integer, MetaData, Table, create_engine, insert
from sqlalchemy.exc import IntegrityError

from grpcserver.auth import TokenRegistry
from grpcserver.interceptor import ServiceInterceptor


class _Context:
    """Records the status the interceptor aborts with."""

    status: Any = None

    async def abort_with_status(self, status: Any) -> None:
        self.status = status


def _integrity_error() -> IntegrityError:
    engine = create_engine("sqlite://")
    table = Table("t", MetaData(), Column("id", Integer, primary_key=True))
    table.metadata.create_all(engine)
    with engine.begin() as connection:
        connection.execute(insert(table).values(id=1))
    try:
        with engine.begin() as connection:
            connection.execute(insert(table).values(id=1))
    except IntegrityError as error:
        return error
    finally:
        engine.dispose()
    raise AssertionError("the duplicate key was accepted")


async def _fail(error: BaseException) -> status_pb2.Status:
    interceptor = ServiceInterceptor(
        domain="test.agentactivity", tokens=TokenRegistry.empty(), telemetry=cast(Any, None)
    )
    context = _Context()
    await interceptor._fail(cast(grpc.aio.ServicerContext[Any, Any], context), error)
    detail = context.status.trailing_metadata[0][1]
    return status_pb2.Status.FromString(detail)


@pytest.mark.spec("SEC-4")
def test_a_constraint_violation_escaping_a_handler_is_failed_precondition_not_internal(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING)
    status = asyncio.run(_fail(_integrity_error()))
    assert status.code == code_pb2.FAILED_PRECONDITION
    info = error_details_pb2.ErrorInfo()
    assert status.details[0].Unpack(info)
    assert info.reason == "STORE_CONSTRAINT_VIOLATION"
    assert "INSERT" not in status.message, "no SQL crosses the wire"
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR or r.exc_info]
    assert any("store refused a write" in r.getMessage() for r in caplog.records)


@pytest.mark.spec("SEC-2")
def test_any_other_unexpected_error_is_still_a_bare_internal(
    caplog: pytest.LogCaptureFixture,
) -> None:
    status = asyncio.run(_fail(RuntimeError("a bug")))
    assert status.code == code_pb2.INTERNAL
    assert "a bug" not in status.message
