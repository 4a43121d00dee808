"""``herder ensemble``: run an ensemble server, and see how the ensemble is doing."""

from __future__ import annotations

import asyncio
from pathlib import Path

import click
import msgspec

from herder.cli.ensemble_security import ensemble_security, ensemble_security_options
from herder.cli.output import bootstrap_option, json_option, print_json, print_table
from herder.ensemble.client import NO_ENSEMBLE_ADVICE, parse_bootstrap, server_status
from herder.ensemble.config import EnsembleConfig
from herder.ensemble.txn import format_zxid
from herder.errors import ConfigError, HerderError


@click.group()
def ensemble() -> None:
    """Run ensemble servers and inspect the ensemble."""


@ensemble.command()
@click.option(
    "--config",
    "config_path",
    required=True,
    type=click.Path(dir_okay=False, path_type=Path),
    help="ensemble.properties with ZooKeeper's names (dataDir, clientPort, server.N …).",
)
def start(config_path: Path) -> None:
    """Run one ensemble server until SIGTERM."""
    from herder.config import load_properties, resolve
    from herder.coordinator.config import CoordinatorConfig
    from herder.coordinator.server import ensemble_server
    from herder.ensemble.server import run_server

    props = resolve(load_properties(config_path))
    try:
        config = EnsembleConfig.from_properties(props)
        coordinator = CoordinatorConfig.from_properties(props)
    except ConfigError as exc:
        raise ConfigError(f"{config_path}: {exc}") from None
    asyncio.run(run_server(ensemble_server(config, coordinator)))


@ensemble.command()
@bootstrap_option
@ensemble_security_options
@json_option
def status(bootstrap: str, as_json: bool) -> None:
    """A row per server: id, role, epoch, last and committed zxid."""
    rows = asyncio.run(_statuses(bootstrap))
    if as_json:
        print_json(rows)
        return
    print_table(
        None,
        [
            "server",
            "address",
            "role",
            "leader",
            "epoch",
            "last zxid",
            "committed zxid",
            "learners",
            "synced by",
            "sessions",
            "logs",
        ],
        [
            [
                r.get("server_id", "?"),
                r["address"],
                r.get("role", f"unreachable: {r.get('error', '')}"),
                "" if r.get("leader", -1) == -1 else r.get("leader"),
                r.get("epoch", ""),
                _zxid(r.get("last_zxid")),
                _zxid(r.get("committed_zxid")),
                ",".join(str(sid) for sid in r.get("learners", []) or []),  # type: ignore[attr-defined]
                r.get("last_sync", ""),
                r.get("sessions", ""),
                r.get("logs", ""),
            ]
            for r in rows
        ],
    )


def _zxid(value: object) -> str:
    return format_zxid(value) if isinstance(value, int) else ""


async def _statuses(bootstrap: str) -> list[dict[str, object]]:
    addresses = [f"{h}:{p}" for h, p in parse_bootstrap(bootstrap)]
    security = ensemble_security()
    seen: dict[str, dict[str, object]] = {}
    queue = list(addresses)
    while queue:
        address = queue.pop(0)
        if address in seen:
            continue
        try:
            st = await server_status(address, security=security)
        except HerderError as exc:
            seen[address] = {"address": address, "error": str(exc)}
            continue
        seen[address] = {
            "address": address,
            **{k: v for k, v in msgspec.structs.asdict(st).items() if k != "peers"},
        }
        # every server knows every other's client address: show the whole ensemble
        queue.extend(p.client_address for p in st.peers if p.client_address)
    if all("error" in r for r in seen.values()):
        raise HerderError(f"no ensemble server answered at {bootstrap}; {NO_ENSEMBLE_ADVICE}")
    return sorted(seen.values(), key=lambda r: (r.get("server_id", 1 << 30), r["address"]))
