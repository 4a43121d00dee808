"""``herder``: the entry point, and the rule that a user's mistake is one clear line.

Every command raises :class:`herder.errors.HerderError` (or click's own usage errors)
for things the user can fix; :func:`main` turns those into ``error: …`` on stderr and a
non-zero exit. Anything else is a bug and keeps its traceback.
"""

from __future__ import annotations

import faulthandler
import logging
import signal
import sys

import click

from herder import __version__, logcontext
from herder.errors import HerderError, with_advice


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, "--version", prog_name="herder")
@click.option(
    "--log-level",
    type=click.Choice(["DEBUG", "INFO", "WARNING", "ERROR"], case_sensitive=False),
    default="WARNING",
    show_default=True,
    envvar="HERDER_LOG_LEVEL",
    help="Logging threshold for messages written to stderr.",
)
@click.option(
    "--log-format",
    type=click.Choice(list(logcontext.FORMATS)),
    default="text",
    show_default=True,
    envvar="HERDER_LOG_FORMAT",
    help="text, or json: one JSON object a line (a worker's log.format sets it too).",
)
def cli(log_level: str, log_format: str) -> None:
    """herder: Kafka Connect's distributed mode on a Zab ensemble, pipelines on Spark."""
    if hasattr(signal, "SIGUSR1") and sys.__stderr__ is not None:
        # ``kill -USR1 <pid>``: every thread's stack to stderr, for a process that hangs
        # (the process's own stderr: a caller may have put one without a file behind it
        # in sys.stderr, as click's test runner does)
        faulthandler.register(signal.SIGUSR1, file=sys.__stderr__, all_threads=True)
    # each line about a connector or task names it: [name|task-0] (Connect's MDC context)
    logcontext.configure(log_level, log_format, sys.stderr)
    # py4j's DEBUG is every command sent to Spark's JVM: a trace of the bridge, not of
    # herder, and slow enough to change what a DEBUG run measures (PUT /admin/loggers/py4j
    # turns it on where wanted)
    if logging.getLogger().level < logging.INFO:
        logging.getLogger("py4j").setLevel(logging.INFO)


def _register_commands() -> None:
    """Attach each layer's command group (imported here to keep start-up cheap)."""
    import importlib

    for module_name, attr in COMMAND_GROUPS:
        module = importlib.import_module(module_name)
        cli.add_command(getattr(module, attr))


#: (module, click group attribute) for each command group; later layers append here.
COMMAND_GROUPS: list[tuple[str, str]] = [
    ("herder.cli.ensemble", "ensemble"),
    ("herder.cli.logs", "logs"),
    ("herder.cli.worker", "worker"),
    ("herder.cli.quickstart", "quickstart"),
    ("herder.cli.groups", "groups"),
    ("herder.cli.verifiable", "verifiable"),
    ("herder.cli.topics", "topics"),
    ("herder.cli.standalone", "standalone"),
    ("herder.cli.connectors", "connectors"),
    ("herder.cli.status", "status"),
]


def main(argv: list[str] | None = None) -> None:
    _register_commands()
    try:
        cli.main(args=argv, prog_name="herder", standalone_mode=False)
    except click.exceptions.Abort:
        click.echo("aborted", err=True)
        sys.exit(130)
    except click.ClickException as exc:
        exc.show()
        sys.exit(exc.exit_code)
    except HerderError as exc:
        click.echo(f"error: {with_advice(exc)}", err=True)
        sys.exit(1)
    except KeyboardInterrupt:
        sys.exit(130)
    except BrokenPipeError:
        sys.exit(0)
