"""``herder connectors``: manage connectors through any worker's REST API.

Every command speaks Kafka Connect's REST API (paths, bodies and status codes), so it
works against any herder worker — distributed or standalone, leader or not — and
against Kafka Connect itself. Output is a table for people and, with ``--json``, the
REST API's own JSON for scripts. A refusal from the worker (unknown connector, invalid
config, a rebalance under way …) is one ``error: …`` line naming the HTTP status, and
the exit status is 1.
"""

from __future__ import annotations

import json
import os
import ssl
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import quote

import click
import httpx

from herder.cli.output import json_option, print_json, print_table
from herder.errors import ConfigError, HerderError

F = TypeVar("F", bound=Callable[..., Any])

DEFAULT_URL = "http://127.0.0.1:8083"
#: a worker answers a request that cannot finish within 90 s with a 500; wait a bit longer
REQUEST_TIMEOUT_S = 100.0

url_option = click.option(
    "--url",
    default=DEFAULT_URL,
    show_default=True,
    envvar="HERDER_URL",
    help="A worker's REST API (env HERDER_URL).",
)


@dataclass(frozen=True)
class ClientSecurity:
    """How the CLI proves itself to a worker: the CA it trusts, its certificate, its user."""

    cacert: str | None = None
    cert: str | None = None
    key: str | None = None
    user: str | None = None
    password: str | None = None

    @classmethod
    def from_environment(cls) -> ClientSecurity:
        """The ``HERDER_CACERT``, ``HERDER_CERT``, ``HERDER_KEY``, ``HERDER_USER`` and
        ``HERDER_PASSWORD`` environment variables, for commands without the options."""
        env = os.environ
        return cls(
            env.get("HERDER_CACERT"),
            env.get("HERDER_CERT"),
            env.get("HERDER_KEY"),
            env.get("HERDER_USER"),
            env.get("HERDER_PASSWORD"),
        )

    def verify(self) -> ssl.SSLContext | bool:
        if self.cacert is None and self.cert is None:
            return True
        try:
            context = ssl.create_default_context(cafile=self.cacert)
            if self.cert is not None:
                context.load_cert_chain(self.cert, self.key)
        except (OSError, ssl.SSLError) as exc:
            raise HerderError(
                f"cannot load --cacert/--cert/--key: {exc}; give PEM files (--cert with the "
                "certificate, --key with its private key unless --cert holds both)"
            ) from None
        return context

    def auth(self) -> tuple[str, str] | None:
        if self.user is None:
            return None
        return (self.user, self.password or "")


class RestError(HerderError):
    """The worker refused a request; the message is its own, with the HTTP status."""

    def __init__(self, message: str, status: int) -> None:
        super().__init__(message)
        self.status = status


class ConnectRest:
    """A thin client of Kafka Connect's REST API: one method per request shape."""

    def __init__(self, url: str, security: ClientSecurity | None = None) -> None:
        self.url = url.rstrip("/")
        security = security or ClientSecurity()
        self._http = httpx.Client(
            base_url=self.url,
            timeout=REQUEST_TIMEOUT_S,
            verify=security.verify(),
            auth=security.auth(),
        )

    def close(self) -> None:
        self._http.close()

    def call(
        self,
        method: str,
        path: str,
        *,
        params: dict[str, Any] | None = None,
        body: Any = None,
    ) -> tuple[int, Any]:
        """(status, decoded JSON body or None); a 4xx/5xx raises :class:`RestError`."""
        try:
            reply = self._http.request(
                method,
                path,
                params=params,
                json=body,
                headers={"accept": "application/json"},
            )
        except httpx.TimeoutException:
            raise HerderError(
                f"the worker at {self.url} did not answer {method} {path} "
                f"within {REQUEST_TIMEOUT_S:g}s; its GET /health and its log say what it is "
                "busy with: try again once it is done"
            ) from None
        except httpx.HTTPError as exc:
            # a worker that requires a client certificate hangs up on a client without one
            hung_up = isinstance(exc, httpx.RemoteProtocolError | httpx.ReadError)
            if _tls_failure(exc) or (hung_up and self.url.startswith("https://")):
                raise HerderError(
                    f"the worker at {self.url} and this client could not agree on TLS: {exc}; "
                    "pass --cacert with the CA that signed the worker's certificate, and "
                    "--cert/--key if the worker requires a client certificate (or use "
                    "https:// in --url for a worker that serves HTTPS)"
                ) from None
            raise HerderError(
                f"cannot reach a worker at {self.url}: {exc}; start one with `herder worker "
                "start --config worker.properties`, or pass --url (or set HERDER_URL) to the "
                "REST API of one that runs"
            ) from None
        content: Any = None
        if reply.content:
            try:
                content = reply.json()
            except ValueError:
                content = reply.text
        if reply.status_code >= 400:
            raise RestError(
                _error_message(reply.status_code, content, f"{method} {path}"), reply.status_code
            )
        return reply.status_code, content

    def get(self, path: str, **params: Any) -> Any:
        return self.call("GET", path, params=params or None)[1]


def _tls_failure(exc: BaseException) -> bool:
    """Whether ``exc`` came from a TLS handshake or alert rather than an absent worker."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, ssl.SSLError) or "SSL" in str(seen):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def _error_message(status: int, content: Any, request: str) -> str:
    message = content.get("message") if isinstance(content, dict) else content
    if not message:
        # not a Connect error body: say which request the worker refused
        detail = content.get("detail") if isinstance(content, dict) else None
        reason = detail if isinstance(detail, str) else httpx.codes.get_reason_phrase(status)
        message = f"{reason or 'request failed'}: {request}"
    # one line: Connect lists a config's problems one per line after a heading ending in ":"
    lines = [line.strip() for line in str(message).splitlines() if line.strip()]
    flat = ""
    for line in lines:
        flat += line if not flat else (" " if flat.endswith(":") else "; ") + line
    return f"{flat} (HTTP {status})"


def _rest(url: str) -> ConnectRest:
    rest = ConnectRest(url, click.get_current_context().find_object(ClientSecurity))
    click.get_current_context().call_on_close(rest.close)
    return rest


def _path(*parts: str | int) -> str:
    return "/" + "/".join(quote(str(p), safe="") for p in parts)


@click.group()
@click.option(
    "--cacert",
    envvar="HERDER_CACERT",
    type=click.Path(exists=True, dir_okay=False),
    help="A PEM file of the CA certificates an https worker is checked against "
    "(env HERDER_CACERT; default: the system's).",
)
@click.option(
    "--cert",
    envvar="HERDER_CERT",
    type=click.Path(exists=True, dir_okay=False),
    help="A PEM client certificate, for workers that ask for one (env HERDER_CERT).",
)
@click.option(
    "--key",
    envvar="HERDER_KEY",
    type=click.Path(exists=True, dir_okay=False),
    help="The private key of --cert, unless --cert holds it too (env HERDER_KEY).",
)
@click.option("--user", envvar="HERDER_USER", help="HTTP Basic user (env HERDER_USER).")
@click.option(
    "--password", envvar="HERDER_PASSWORD", help="That user's password (env HERDER_PASSWORD)."
)
@click.pass_context
def connectors(
    ctx: click.Context,
    cacert: str | None,
    cert: str | None,
    key: str | None,
    user: str | None,
    password: str | None,
) -> None:
    """Manage connectors through a worker's REST API (Kafka Connect's)."""
    ctx.obj = ClientSecurity(cacert, cert, key, user, password)


# -- configs from files and -c ------------------------------------------------------------


def config_options(function: F) -> F:
    """``--file``/``-f`` and repeated ``--config``/``-c key=value``."""
    function = click.option(
        "-c",
        "--config",
        "pairs",
        multiple=True,
        metavar="KEY=VALUE",
        help="A config entry; repeatable; wins over the file.",
    )(function)
    return click.option(
        "-f",
        "--file",
        "config_file",
        type=click.Path(dir_okay=False, path_type=Path),
        help="Config file: Java properties, or JSON ({name, config} or a flat object).",
    )(function)


def _parse_pairs(pairs: Iterable[str]) -> dict[str, str]:
    config: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise click.BadParameter(f"{pair!r} is not KEY=VALUE", param_hint="-c/--config")
        config[key.strip()] = value
    return config


def _read_config(
    config_file: Path | None, pairs: Iterable[str]
) -> tuple[str | None, dict[str, str]]:
    """(name from the file, if any; the config) from a file and ``-c`` pairs."""
    from herder.runtime.standalone import parse_connector_text

    name: str | None = None
    config: dict[str, str] = {}
    if config_file is not None:
        source = str(config_file)
        try:
            text = sys.stdin.read() if source == "-" else config_file.read_text(encoding="utf-8")
        except OSError as exc:
            raise ConfigError(f"cannot read {source}: {exc.strerror}") from None
        name, config = parse_connector_text(text, source)
    config.update(_parse_pairs(pairs))
    return name, config


# -- list, get, status ----------------------------------------------------------------------


def _task_summary(status: dict[str, Any]) -> str:
    tasks = status.get("tasks", [])
    running = sum(1 for t in tasks if t.get("state") == "RUNNING")
    failed = sum(1 for t in tasks if t.get("state") == "FAILED")
    summary = f"{running}/{len(tasks)} running"
    return summary + (f", {failed} failed" if failed else "")


@connectors.command("list")
@click.option(
    "--expand",
    multiple=True,
    type=click.Choice(["status", "info"]),
    help="With --json: include each connector's status and/or info (repeatable).",
)
@url_option
@json_option
def list_(expand: tuple[str, ...], url: str, as_json: bool) -> None:
    """List connectors with their type, state and tasks."""
    rest = _rest(url)
    if as_json:
        print_json(
            rest.get("/connectors", expand=list(expand)) if expand else rest.get("/connectors")
        )
        return
    listed = rest.get("/connectors", expand=["status", "info"])
    rows = []
    for name in sorted(listed):
        entry = listed[name]
        status = entry.get("status", {})
        info = entry.get("info", {})
        rows.append(
            [
                name,
                info.get("type", status.get("type", "")),
                status.get("connector", {}).get("state", ""),
                _task_summary(status),
                status.get("connector", {}).get("worker_id", ""),
            ]
        )
    print_table(None, ["connector", "type", "state", "tasks", "worker"], rows)


@connectors.command()
@click.argument("name")
@url_option
@json_option
def get(name: str, url: str, as_json: bool) -> None:
    """Show connector NAME: its type, config and tasks."""
    info = _rest(url).get(_path("connectors", name))
    if as_json:
        print_json(info)
        return
    _print_info(info)


def _print_info(info: dict[str, Any]) -> None:
    tasks = info.get("tasks", [])
    click.echo(f"connector: {info.get('name')}")
    click.echo(f"     type: {info.get('type', '')}")
    click.echo(f"    tasks: {', '.join(str(t.get('task')) for t in tasks) or '-'}")
    config = info.get("config", {})
    print_table("config", ["key", "value"], [[k, config[k]] for k in sorted(config)])


@connectors.command()
@click.argument("name")
@url_option
@json_option
def status(name: str, url: str, as_json: bool) -> None:
    """Show the state of connector NAME and of each of its tasks."""
    current = _rest(url).get(_path("connectors", name, "status"))
    if as_json:
        print_json(current)
        return
    _print_status(current)


def _trace_summary(trace: str | None) -> str:
    """The line of a trace that says what went wrong: a Python trace ends with it."""
    lines = [line for line in (trace or "").strip().splitlines() if line.strip()]
    if not lines:
        return ""
    return lines[-1].strip() if lines[0].startswith("Traceback") else lines[0].strip()


def _print_status(current: dict[str, Any]) -> None:
    connector = current.get("connector", {})
    click.echo(
        f"connector {current.get('name')} ({current.get('type', '')}): "
        f"{connector.get('state', '')} on {connector.get('worker_id') or '-'}"
    )
    if connector.get("trace"):
        click.echo(f"  {_trace_summary(connector['trace'])}")
    tasks = current.get("tasks", [])
    # a column for the lag only when some task reports one (sources that can say)
    lags = any("lag" in t for t in tasks)
    print_table(
        "tasks",
        ["task", "state", "worker", *(["lag"] if lags else []), "trace"],
        [
            [
                t.get("id"),
                t.get("state"),
                t.get("worker_id"),
                *([_lag_summary(t.get("lag"))] if lags else []),
                _trace_summary(t.get("trace")),
            ]
            for t in tasks
        ],
    )


def _lag_summary(lag: dict[str, Any] | None) -> str:
    """A task's lag figures on one line: ``bytes=1843200 seconds=95.3``."""
    return " ".join(f"{k}={v}" for k, v in (lag or {}).items())


# -- create, update, delete ------------------------------------------------------------------


@connectors.command()
@click.argument("name", required=False)
@config_options
@click.option(
    "--initial-state",
    type=click.Choice(["RUNNING", "PAUSED", "STOPPED"], case_sensitive=False),
    help="State the new connector starts in (default RUNNING).",
)
@url_option
@json_option
def create(
    name: str | None,
    config_file: Path | None,
    pairs: tuple[str, ...],
    initial_state: str | None,
    url: str,
    as_json: bool,
) -> None:
    """Create a connector from a config file and/or -c KEY=VALUE entries.

    NAME defaults to the name in the file (its "name" key or JSON field).
    """
    file_name, config = _read_config(config_file, pairs)
    name = name or file_name or config.get("name")
    if not name:
        raise click.UsageError("give the connector a NAME, or a name in the config")
    config["name"] = name
    body: dict[str, Any] = {"name": name, "config": config}
    if initial_state:
        body["initial_state"] = initial_state.upper()
    _, info = _rest(url).call("POST", "/connectors", body=body)
    if as_json:
        print_json(info)
        return
    kind = info.get("type", "") if isinstance(info, dict) else ""
    click.echo(f"created connector {name}" + (f" ({kind})" if kind else ""))


@connectors.command()
@click.argument("name")
@config_options
@click.option(
    "--patch",
    is_flag=True,
    help="Change only the given keys (PATCH) instead of replacing the whole config.",
)
@click.option(
    "--unset",
    multiple=True,
    metavar="KEY",
    help="Remove KEY from the config (repeatable; implies --patch).",
)
@url_option
@json_option
def update(
    name: str,
    config_file: Path | None,
    pairs: tuple[str, ...],
    patch: bool,
    unset: tuple[str, ...],
    url: str,
    as_json: bool,
) -> None:
    """Replace the config of connector NAME (it is created if it does not exist).

    With --patch or --unset, only the given keys change and the rest stay as they are.
    """
    file_name, config = _read_config(config_file, pairs)
    if file_name and file_name != name:
        raise click.UsageError(f"the config names connector {file_name!r}, not {name!r}")
    rest = _rest(url)
    if patch or unset:
        changes: dict[str, str | None] = {k: v for k, v in config.items() if k != "name"}
        changes.update({key: None for key in unset})
        if not changes:
            raise click.UsageError("nothing to change: give -c KEY=VALUE, a file or --unset")
        code, info = rest.call("PATCH", _path("connectors", name, "config"), body=changes)
    else:
        if not config:
            raise click.UsageError("no config given: use -f FILE and/or -c KEY=VALUE")
        config["name"] = name
        code, info = rest.call("PUT", _path("connectors", name, "config"), body=config)
    if as_json:
        print_json(info)
        return
    click.echo(f"{'created' if code == 201 else 'updated'} connector {name}")


@connectors.command()
@click.argument("name")
@url_option
@json_option
def delete(name: str, url: str, as_json: bool) -> None:
    """Delete connector NAME and stop its tasks."""
    _rest(url).call("DELETE", _path("connectors", name))
    _done(as_json, name, "deleted", f"deleted connector {name}")


def _done(as_json: bool, name: str, what: str, line: str) -> None:
    if as_json:
        print_json({"name": name, "result": what})
    else:
        click.echo(line)


# -- pause, resume, stop, restart -----------------------------------------------------------


def _target_state_command(verb: str, past: str, doc: str) -> None:
    @connectors.command(verb, help=doc)
    @click.argument("name")
    @url_option
    @json_option
    def command(name: str, url: str, as_json: bool) -> None:
        _rest(url).call("PUT", _path("connectors", name, verb))
        _done(as_json, name, f"{past}", f"{verb} requested for connector {name}")


_target_state_command(
    "pause", "pause requested", "Pause connector NAME and its tasks (they keep their place)."
)
_target_state_command("resume", "resume requested", "Resume connector NAME and its tasks.")
_target_state_command(
    "stop",
    "stop requested",
    "Stop connector NAME: shut its tasks down (offsets can then be changed).",
)


@connectors.command()
@click.argument("name")
@click.argument("task", type=int, required=False)
@click.option("--include-tasks", is_flag=True, help="Restart the connector's tasks too.")
@click.option("--only-failed", is_flag=True, help="Restart only instances that have FAILED.")
@url_option
@json_option
def restart(
    name: str, task: int | None, include_tasks: bool, only_failed: bool, url: str, as_json: bool
) -> None:
    """Restart connector NAME, or only its task TASK (a task id)."""
    rest = _rest(url)
    if task is not None:
        if include_tasks or only_failed:
            raise click.UsageError(
                "--include-tasks and --only-failed apply to a connector, not to a task"
            )
        rest.call("POST", _path("connectors", name, "tasks", task, "restart"))
        _done(as_json, name, "restarted", f"restarted task {task} of connector {name}")
        return
    params = {
        "includeTasks": "true" if include_tasks else "false",
        "onlyFailed": "true" if only_failed else "false",
    }
    code, body = rest.call("POST", _path("connectors", name, "restart"), params=params)
    if as_json:
        print_json(body if body is not None else {"name": name, "result": "restarted"})
        return
    if code == 202 and isinstance(body, dict):
        click.echo(f"restarting connector {name}:")
        _print_status(body)
    else:
        click.echo(f"restarted connector {name}")


# -- offsets -------------------------------------------------------------------------------


@connectors.group()
def offsets() -> None:
    """Read, alter or reset a connector's offsets (alter and reset need it STOPPED)."""


def _print_offsets(listed: dict[str, Any]) -> None:
    print_table(
        None,
        ["partition", "offset"],
        [
            [
                json.dumps(o.get("partition"), sort_keys=True),
                json.dumps(o.get("offset"), sort_keys=True),
            ]
            for o in listed.get("offsets", [])
        ],
    )


@offsets.command("get")
@click.argument("name")
@url_option
@json_option
def offsets_get(name: str, url: str, as_json: bool) -> None:
    """Show the offsets of connector NAME, one row per partition."""
    listed = _rest(url).get(_path("connectors", name, "offsets"))
    if as_json:
        print_json(listed)
        return
    _print_offsets(listed)


def _json_option_value(text: str, what: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise click.BadParameter(f"not JSON: {exc}", param_hint=what) from None


@offsets.command("alter")
@click.argument("name")
@click.option(
    "-f",
    "--file",
    "offsets_file",
    type=click.Path(dir_okay=False, path_type=Path),
    help='JSON: {"offsets": [{"partition": {...}, "offset": {...}}, ...]} ("-" reads stdin).',
)
@click.option("--partition", "partition", metavar="JSON", help="One partition, as JSON.")
@click.option(
    "--offset", "offset", metavar="JSON", help="Its new offset, as JSON (null removes it)."
)
@url_option
@json_option
def offsets_alter(
    name: str,
    offsets_file: Path | None,
    partition: str | None,
    offset: str | None,
    url: str,
    as_json: bool,
) -> None:
    """Set offsets of the STOPPED connector NAME, from a file or one --partition/--offset."""
    if (offsets_file is None) == (partition is None):
        raise click.UsageError("give either -f FILE or --partition JSON with --offset JSON")
    if offsets_file is not None:
        try:
            text = sys.stdin.read() if str(offsets_file) == "-" else offsets_file.read_text()
        except OSError as exc:
            raise ConfigError(f"cannot read {offsets_file}: {exc.strerror}") from None
        body = _json_option_value(text, str(offsets_file))
        if isinstance(body, list):
            body = {"offsets": body}
    else:
        if offset is None:
            raise click.UsageError("--partition needs --offset")
        assert partition is not None
        body = {
            "offsets": [
                {
                    "partition": _json_option_value(partition, "--partition"),
                    "offset": _json_option_value(offset, "--offset"),
                }
            ]
        }
    _, reply = _rest(url).call("PATCH", _path("connectors", name, "offsets"), body=body)
    if as_json:
        print_json(reply)
        return
    click.echo(_message(reply, f"altered the offsets of connector {name}"))


@offsets.command("reset")
@click.argument("name")
@url_option
@json_option
def offsets_reset(name: str, url: str, as_json: bool) -> None:
    """Remove every offset of the STOPPED connector NAME."""
    _, reply = _rest(url).call("DELETE", _path("connectors", name, "offsets"))
    if as_json:
        print_json(reply)
        return
    click.echo(_message(reply, f"reset the offsets of connector {name}"))


def _message(reply: Any, fallback: str) -> str:
    if isinstance(reply, dict) and reply.get("message"):
        return str(reply["message"])
    return fallback


# -- plugins and validation ------------------------------------------------------------------


@connectors.command()
@click.argument("plugin", required=False)
@click.option("--all", "everything", is_flag=True, help="Transforms and predicates too.")
@url_option
@json_option
def plugins(plugin: str | None, everything: bool, url: str, as_json: bool) -> None:
    """List the worker's connector plugins, or the config keys of PLUGIN."""
    rest = _rest(url)
    if plugin is not None:
        keys = rest.get(_path("connector-plugins", plugin, "config"))
        if as_json:
            print_json(keys)
            return
        print_table(
            plugin,
            ["key", "type", "required", "default", "importance", "documentation"],
            [
                [
                    k.get("name"),
                    k.get("type"),
                    "yes" if k.get("required") else "",
                    k.get("default_value"),
                    k.get("importance"),
                    k.get("documentation"),
                ]
                for k in keys
            ],
        )
        return
    listed = rest.get("/connector-plugins", connectorsOnly="false" if everything else "true")
    if as_json:
        print_json(listed)
        return
    print_table(
        None,
        ["class", "type", "version"],
        [[p.get("class"), p.get("type"), p.get("version")] for p in listed],
    )


@connectors.command()
@click.argument("plugin", required=False)
@config_options
@url_option
@json_option
def validate(
    plugin: str | None, config_file: Path | None, pairs: tuple[str, ...], url: str, as_json: bool
) -> None:
    """Check a connector config against its plugin without creating anything.

    PLUGIN defaults to the config's connector.class. Prints each key's value and
    errors; the exit status is 1 when the config has errors.
    """
    _, config = _read_config(config_file, pairs)
    plugin = plugin or config.get("connector.class")
    if not plugin:
        raise click.UsageError("give the PLUGIN, or connector.class in the config")
    config.setdefault("connector.class", plugin)
    _, result = _rest(url).call(
        "PUT", _path("connector-plugins", plugin, "config", "validate"), body=config
    )
    count = int(result.get("error_count", 0))
    if as_json:
        print_json(result)
    else:
        rows = []
        for entry in result.get("configs", []):
            value = entry.get("value", {})
            if value.get("name") in config or value.get("errors"):
                rows.append(
                    [value.get("name"), value.get("value"), "; ".join(value.get("errors") or [])]
                )
        print_table(result.get("name"), ["key", "value", "errors"], rows)
    if count:
        raise ConfigError(f"the config has {count} error(s) for {result.get('name', plugin)}")
    if not as_json:
        click.echo("the config is valid")
