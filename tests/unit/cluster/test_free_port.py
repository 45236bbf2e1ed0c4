"""Ports for the local control plane come from below the kernel's ephemeral range."""

from __future__ import annotations

import socket

import pytest

from webhook.cluster import controlplane


def test_ports_are_below_the_ephemeral_range_distinct_and_free() -> None:
    low, _ = controlplane._ephemeral_range()  # noqa: SLF001 - the range the choice must avoid
    ports = [controlplane.free_port() for _ in range(50)]
    assert len(set(ports)) == len(ports)
    assert all(controlplane._PORT_FLOOR <= port < low for port in ports)  # noqa: SLF001
    for port in ports[:5]:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind(("127.0.0.1", port))  # nobody holds it


def test_a_taken_port_is_never_handed_out(monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        taken = holder.getsockname()[1]
        spare = next(port for port in range(12_000, 13_000) if controlplane._bindable(port))  # noqa: SLF001
        choices = iter([taken, taken, spare])
        monkeypatch.setattr(controlplane._random, "randrange", lambda *_: next(choices))  # noqa: SLF001
        monkeypatch.setattr(controlplane, "_ephemeral_range", lambda: (max(taken + 1, 20_000), 60_999))
        monkeypatch.setattr(controlplane, "_handed_out", set())
        assert controlplane.free_port() == spare


def test_without_room_below_the_range_the_kernel_picks(monkeypatch: pytest.MonkeyPatch) -> None:
    real_low, real_high = controlplane._ephemeral_range()  # noqa: SLF001
    monkeypatch.setattr(controlplane, "_ephemeral_range", lambda: (10_500, 60_999))
    assert real_low <= controlplane.free_port() <= real_high  # the kernel's choice, from its range
