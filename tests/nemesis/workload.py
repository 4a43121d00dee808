"""The ensemble append workload: numbered records appended one at a time, every outcome kept.

Run as a process of its own (in a namespace of its own during the soak)::

    python -m tests.nemesis.workload --bootstrap A,B,C --log appends --out appends.jsonl \\
        --stop-file stop

It appends ``b"<n>"`` for n = 0, 1, 2 … to ``--log``, one write in flight, and writes one
JSON line per attempt to ``--out`` — ``{"n", "start", "end", "ok", "offset" | "error"}``
with wall-clock times — flushed as soon as the answer is in: an ``ok`` line is a write
the ensemble acknowledged, which must be in the log exactly once, in order. A write that
failed (timed out, its server gone) is *indeterminate*: it may have committed, but at
most once. A client that gave up is replaced by a new one (a new session); the numbers go
on. The process ends when ``--stop-file`` exists.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import IO

from herder.ensemble.sync_client import SyncEnsembleClient
from herder.errors import HerderError

#: how long one write may take, retries to other servers included, before it counts as
#: failed and the next number is tried
WRITE_GIVE_UP_S = 8.0


def _client(bootstrap: str) -> SyncEnsembleClient:
    return SyncEnsembleClient(
        bootstrap,
        name="nemesis-appends",
        session_timeout_ms=10_000,
        request_timeout=3.0,
        connect_timeout=1.0,
        give_up_after=WRITE_GIVE_UP_S,
    )


def _record(out: IO[str], entry: dict[str, object]) -> None:
    out.write(json.dumps(entry) + "\n")
    out.flush()


def run(bootstrap: str, log_name: str, out_path: Path, stop_file: Path) -> int:
    """Append until ``stop_file`` appears; return how many writes were acknowledged."""
    acked = 0
    n = 0
    client: SyncEnsembleClient | None = None
    with open(out_path, "a") as out:
        while not stop_file.exists():
            start = time.time()
            try:
                if client is None:
                    client = _client(bootstrap)
                    client.create_log(log_name, if_absent=True)
                offset = client.append(log_name, str(n).encode())
            except (HerderError, OSError, TimeoutError) as exc:
                _record(
                    out,
                    {"n": n, "start": start, "end": time.time(), "ok": False, "error": str(exc)},
                )
                if client is not None:
                    client.close()
                    client = None
                time.sleep(0.2)  # a pause before a new client, not a wait for a condition
            else:
                _record(
                    out, {"n": n, "start": start, "end": time.time(), "ok": True, "offset": offset}
                )
                acked += 1
            n += 1
    if client is not None:
        client.close()
    return acked


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--log", default="nemesis-appends")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--stop-file", type=Path, required=True)
    args = parser.parse_args()
    acked = run(args.bootstrap, args.log, args.out, args.stop_file)
    print(f"{acked} appends acknowledged", flush=True)


if __name__ == "__main__":
    main()
