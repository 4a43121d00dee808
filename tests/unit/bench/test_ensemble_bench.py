"""The ensemble benchmark's own logic: sizes it accepts, configs it writes, verdicts."""

from pathlib import Path

import pytest
from bench import _procs
from bench.ensemble import (
    ServerSlot,
    UnsupportedSetup,
    check_servers,
    comparison,
    judge,
    parse_args,
    zookeeper_cfg,
)

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("servers", [1, 3, 5])
def test_accepts_a_standalone_server_or_an_ensemble_that_survives_a_failure(servers: int) -> None:
    check_servers(servers)


@pytest.mark.parametrize("servers", [0, 2])
def test_refuses_sizes_with_nothing_to_measure(servers: int) -> None:
    with pytest.raises(UnsupportedSetup, match=f"--servers {servers}"):
        check_servers(servers)


def test_defaults_run_five_failovers_and_miss_fifty_thousand_writes() -> None:
    args = parse_args(["--servers", "3"])
    assert (args.servers, args.failover_runs, args.catchup_writes) == (3, 5, 50_000)


def test_negative_failover_runs_are_a_usage_error() -> None:
    with pytest.raises(SystemExit):
        parse_args(["--failover-runs", "-1"])


def test_replicated_zookeeper_config_names_every_server(tmp_path: Path) -> None:
    slots = [ServerSlot(i, 2180 + i, 2880 + i, 3880 + i) for i in (1, 2, 3)]
    cfg = zookeeper_cfg(slots[1], slots, tmp_path).splitlines()
    assert "clientPort=2182" in cfg
    assert "server.3=127.0.0.1:2883:3883" in cfg
    assert "4lw.commands.whitelist=srvr" in cfg
    assert "forceSync=yes" in cfg


def _step(clients: int, ops: int, each: list[float]) -> dict[str, object]:
    return {
        "clients": clients,
        "ops_per_s": ops,
        "server_cpu_pct": sum(each),
        "server_cpu_pct_each": each,
        "machine_cpu_pct": 50.0,
        "other_cpu_pct": 0.0,
    }


def test_the_busiest_server_not_the_sum_decides_that_the_ensemble_is_the_limit() -> None:
    # 3 x 40% is above one core in sum, but no server is busy: add clients
    assert not judge([_step(1, 1000, [40.0, 40.0, 40.0])], 4, "").stop
    verdict = judge([_step(1, 1000, [95.0, 40.0, 40.0])], 4, "")
    assert verdict.stop and verdict.limit == "server"
    assert "busiest server" in verdict.reason


def test_failover_and_catchup_compare_medians() -> None:
    def system(writes: int, failover: list[float], catchup: float) -> dict[str, object]:
        return {
            "writes_per_s": writes,
            "reads_per_s": 1,
            "sync_write_p50_ms": 1.0,
            "sync_write_p99_ms": 1.0,
            "server_cpu_s_per_1000_writes": 1.0,
            "failover": {"seconds": _procs.spread(failover)},
            "catchup": {"seconds": catchup},
        }

    result = comparison(system(2000, [0.3, 0.4, 0.9], 2.0), system(1900, [0.4, 0.5, 0.6], 1.0))
    assert result["ratios"]["failover_s"] == 0.8
    assert result["ratios"]["catchup_s"] == 2.0
    assert result["target"]["failover_no_slower"] is True
    assert result["target"]["catchup_no_slower"] is False
    assert result["target"]["met"] is False


def test_spread_of_an_even_count_takes_the_middle_two() -> None:
    assert _procs.spread([4.0, 1.0, 2.0, 3.0]) == {
        "count": 4,
        "min": 1.0,
        "median": 2.5,
        "max": 4.0,
    }
