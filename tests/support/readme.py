"""The README's shell examples as data, so tests can check and run them (drift checks)."""

from __future__ import annotations

import json
import re
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["README", "GrpcurlExample", "grpcurl_examples", "shell_blocks", "shell_commands"]

README = Path(__file__).resolve().parents[2] / "README.md"


def shell_blocks(text: str | None = None) -> list[str]:
    """The bodies of the README's ```` ```sh ```` code blocks, in order."""
    text = README.read_text(encoding="utf-8") if text is None else text
    return re.findall(r"^```sh\n(.*?)^```", text, re.DOTALL | re.MULTILINE)


def shell_commands(block: str) -> list[str]:
    """The commands of one block as written, one string each.

    A newline ends a command unless it is quoted (a JSON body may span lines) or escaped
    (``\\`` continuation, which becomes a space); a ``#`` after a blank, outside quotes,
    starts a comment.
    """
    commands: list[str] = []
    current: list[str] = []
    quote: str | None = None
    index = 0
    while index < len(block):
        char = block[index]
        if quote:
            quote = None if char == quote else quote
            current.append(char)
        elif char in "'\"":
            quote = char
            current.append(char)
        elif char == "\\" and block.startswith("\n", index + 1):
            current.append(" ")
            index += 1
        elif char == "#" and (not current or current[-1].isspace()):
            while index < len(block) and block[index] != "\n":
                index += 1
            continue
        elif char == "\n":
            command = "".join(current).strip()
            if command:
                commands.append(command)
            current = []
        else:
            current.append(char)
        index += 1
    command = "".join(current).strip()
    if command:
        commands.append(command)
    return commands


@dataclass(frozen=True)
class GrpcurlExample:
    """One ``grpcurl`` command of the README."""

    command: str
    """The command as one line."""

    address: str
    """``host:port`` it dials."""

    service: str | None
    """Full service name, or ``None`` for ``list``."""

    method: str | None
    """Method name, or ``None`` for ``list``."""

    body: dict[str, Any] | None
    """The parsed ``-d`` JSON, ``None`` without ``-d``."""

    authorized: bool
    """Whether it sends a bearer token (``-H "authorization: Bearer ..."`` or ``${H[@]}``)."""


def grpcurl_examples(text: str | None = None) -> list[GrpcurlExample]:
    """Every ``grpcurl`` command of the README's shell blocks, in order.

    Raises:
        ValueError: A ``-d`` body is not JSON (the message names the command).
    """
    examples = []
    for block in shell_blocks(text):
        for command in shell_commands(block):
            words = shlex.split(command)
            if words[0] != "grpcurl":
                continue
            body = None
            if "-d" in words:
                raw = words[words.index("-d") + 1]
                try:
                    body = json.loads(raw)
                except ValueError as error:
                    raise ValueError(f"{command}: -d is not JSON: {error}") from None
            authorized = "${H[@]}" in words or any(
                word.lower().startswith("authorization: bearer ") for word in words
            )
            if words[-1] == "list":
                examples.append(GrpcurlExample(command, words[-2], None, None, body, authorized))
                continue
            service, _, method = words[-1].rpartition("/")
            examples.append(GrpcurlExample(command, words[-2], service, method, body, authorized))
    return examples
