"""The ``pharos`` console script: ``check``, ``config-schema``, ``doctor``, ``keys``, ``bench``,
``sim-engine``. This module and ``pharos.tap`` are the only ones touching the global reactor."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from twisted.internet.defer import Deferred
from twisted.internet.interfaces import IReactorTime

from pharos import __version__
from pharos.engine.library import AUTO, KINDS


def main(argv: Sequence[str] | None = None) -> None:
    """Entry point of the console script."""
    argv = list(sys.argv[1:] if argv is None else argv)
    # These pass their whole argument list (--help included) to their own parsers.
    if argv[:1] == ["sim-engine"]:
        raise SystemExit(cmd_sim_engine(argparse.Namespace(rest=argv[1:])))
    if argv[:1] == ["calibrate"]:
        raise SystemExit(cmd_calibrate(argparse.Namespace(rest=argv[1:])))
    if argv[:1] == ["bench"] and argv[1:2] in [[w] for w in BENCH]:
        raise SystemExit(cmd_bench(argparse.Namespace(what=argv[1], rest=argv[2:])))
    parser = _parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        raise SystemExit(2)
    raise SystemExit(args.func(args))


def cmd_replay_shadow(args: argparse.Namespace) -> int:
    """``pharos replay-shadow LOG`` (``pharos.shadow.main_replay``)."""
    from pharos.shadow import main_replay

    return main_replay([args.log])


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="pharos", description="Pharos: an LLM inference router")
    parser.add_argument("--version", action="version", version=f"pharos {__version__}")
    sub = parser.add_subparsers(metavar="COMMAND")

    check = sub.add_parser("check", help="validate a config file")
    check.add_argument("-c", "--config", required=True, help="the config file")
    check.set_defaults(func=cmd_check)

    schema = sub.add_parser("config-schema",
                            help="print the config file's JSON Schema (for editors)")
    schema.add_argument("--rst", action="store_true",
                        help="print the configuration reference (docs/configuration.rst)")
    schema.set_defaults(func=cmd_config_schema)

    keys = sub.add_parser("keys", help="API keys")
    keys_sub = keys.add_subparsers(metavar="ACTION")
    new = keys_sub.add_parser(
        "new", help="make a key: prints it once, with the config entry that holds its SHA-256")
    new.add_argument("--name", required=True, help="the key's name (usage is recorded by it)")
    new.add_argument("--tenant", help="the tenant it belongs to (a name in tenants:)")
    new.add_argument("--admin", action="store_true", help="may call /admin/* and /usage")
    new.set_defaults(func=cmd_keys_new)

    doctor = sub.add_parser(
        "doctor", help="show what Pharos reads from each backend (and record captures)"
    )
    where = doctor.add_mutually_exclusive_group(required=True)
    where.add_argument("-c", "--config", help="examine every backend of this config file")
    where.add_argument("--url", help="examine one engine at this base URL")
    where.add_argument("--capture", help="examine a recorded capture directory (fixtures/...)")
    doctor.add_argument("--kind", default=AUTO, choices=(AUTO, *KINDS),
                        help="engine kind (default: detect)")
    doctor.add_argument("--log", help="with --url: the engine's log file, for log probes")
    doctor.add_argument("--logs", action="store_true",
                        help="with --record: also record the engine's log (it can contain "
                             "prompts: review it before sharing)")
    doctor.add_argument("--json", action="store_true", help="print one JSON document")
    doctor.add_argument("--record", metavar="DIR",
                        help="with --url: write what the engine serves in the fixture format")
    doctor.add_argument("--streams", action="store_true",
                        help="with --record: also record replies to chat/completion requests")
    doctor.add_argument("--meta", action="append", default=[], metavar="KEY=VALUE",
                        help="with --record: extra meta.yaml fields")
    doctor.add_argument("--timeout", type=float, default=5.0,
                        help="seconds to wait for each path (default 5)")
    doctor.set_defaults(func=cmd_doctor)

    bench = sub.add_parser("bench", help="benchmarks: pick, overhead, memory, run, compare, "
                                         "report, placement (reported, not asserted)")
    bench.add_argument("what", choices=BENCH)
    bench.add_argument("rest", nargs=argparse.REMAINDER)
    bench.set_defaults(func=cmd_bench)

    calibrate = sub.add_parser(
        "calibrate", help="fit an idle engine's prefill cost model (prints a config fragment)")
    calibrate.add_argument("rest", nargs=argparse.REMAINDER)
    calibrate.set_defaults(func=cmd_calibrate)

    shadow = sub.add_parser(
        "replay-shadow", help="check a shadow log: its chain, and every shadow decision re-run")
    shadow.add_argument("log", help="the observability.shadow_log file")
    shadow.set_defaults(func=cmd_replay_shadow)

    sim = sub.add_parser("sim-engine", help="run one simulated engine on loopback")
    sim.add_argument("rest", nargs=argparse.REMAINDER)
    sim.set_defaults(func=cmd_sim_engine)
    return parser


#: ``pharos bench`` subcommands.
BENCH = ("pick", "overhead", "memory", "run", "compare", "report", "placement")


def cmd_bench(args: argparse.Namespace) -> int:
    """``pharos bench pick|overhead|memory|run|compare|report ...``."""
    if args.what in ("run", "compare"):
        from twisted.internet import reactor

        if args.what == "run":
            from pharos.bench.run import main_run

            return main_run(args.rest, reactor)
        from pharos.bench.compare import main_compare

        return main_compare(args.rest, reactor)
    if args.what == "placement":
        from pharos.bench.placement import main_placement

        return main_placement(args.rest)
    if args.what == "report":
        from pharos.bench.report import main_report

        return main_report(args.rest)
    if args.what == "pick":
        from pharos.bench.pick import main_pick

        return main_pick(args.rest)
    if args.what == "memory":
        from pharos.bench.memory import main_memory

        return main_memory(args.rest)
    from pharos.bench.overhead import main_overhead

    return main_overhead(args.rest)


def cmd_calibrate(args: argparse.Namespace) -> int:
    """``pharos calibrate --url ENGINE``: probe an idle engine, fit P(u, c), print the fit."""
    from twisted.internet import defer, task

    from pharos.calibrate import main_calibrate, parse_args

    options = parse_args(args.rest)
    result: list[int] = []

    async def run(reactor: IReactorTime) -> None:
        result.append(await main_calibrate(options, reactor))

    try:
        task.react(lambda r: defer.Deferred.fromCoroutine(run(r)))
    except SystemExit as e:
        if e.code not in (0, None) or not result:
            raise
    return result[0] if result else 2


def cmd_sim_engine(args: argparse.Namespace) -> int:
    """``pharos sim-engine --kind K --port P``: one engine double until Ctrl-C."""
    from twisted.internet import reactor

    from pharos.sim.cli import main_sim_engine

    return main_sim_engine(args.rest, reactor)


def cmd_config_schema(args: argparse.Namespace) -> int:
    """``pharos config-schema``: the JSON Schema of ``pharos.yaml`` on stdout; ``--rst``: the
    configuration reference, both generated from the config's dataclasses."""
    import json

    from pharos.config.describe import reference, schema

    if args.rst:
        sys.stdout.write(reference())
    else:
        print(json.dumps(schema(), indent=1, ensure_ascii=False))
    return 0


def cmd_keys_new(args: argparse.Namespace) -> int:
    """``pharos keys new --name NAME``: the key once on stdout with its YAML entry; the key
    itself is stored nowhere (Pharos keeps its SHA-256 only)."""
    import json

    from pharos.proxy.auth import new_key

    name: str = args.name
    if not name.strip() or any(c in name for c in "\r\n\t") or name != name.strip():
        print(f"pharos keys new: --name must be a non-empty name without surrounding spaces or "
              f"control characters, got {name!r}", file=sys.stderr)
        return 2
    key, sha256 = new_key()
    print(key)
    print(f"# the key of {name} above is shown once: store it now (Pharos keeps only its "
          f"SHA-256)\n# add this entry to the keys: section of pharos.yaml")
    print(f"- name: {json.dumps(name, ensure_ascii=False)}")
    print(f"  sha256: {sha256}")
    if args.tenant:
        print(f"  tenant: {json.dumps(args.tenant, ensure_ascii=False)}")
    if args.admin:
        print("  admin: true")
    return 0


def cmd_check(args: argparse.Namespace) -> int:
    """``pharos check -c FILE``: 0 when the file is a valid config, else 1 with every error."""
    from pharos.config import ConfigError, exposure_warning, load_config

    try:
        cfg = load_config(args.config)
    except ConfigError as e:
        print(f"{args.config}: invalid", file=sys.stderr)
        print(str(e), file=sys.stderr)
        return 1
    except OSError as e:
        print(f"{args.config}: {e.strerror}", file=sys.stderr)
        return 1
    print(f"{args.config}: ok ({len(cfg.backends)} backends, {len(cfg.keys)} keys)")
    risk = exposure_warning(cfg)
    if risk is not None:
        print(f"warning: {risk}")
    return 0


def cmd_doctor(args: argparse.Namespace) -> int:
    """``pharos doctor``: resolve each backend and print the report."""
    from twisted.internet import task

    code: list[int] = []

    def run(reactor: IReactorTime) -> Deferred[None]:
        async def go() -> None:
            code.append(await _doctor(args, reactor))

        return Deferred.fromCoroutine(go())

    try:
        task.react(run)
    except SystemExit as e:
        if e.code:
            return 2
    return code[0] if code else 2


async def _doctor(args: argparse.Namespace, reactor: IReactorTime) -> int:
    from pharos.engine.doctor import examine, render_json, render_text
    from pharos.engine.fetch import CaptureFetcher, HTTPFetcher, make_client

    if args.logs and not args.record:
        print("doctor: --logs records the engine's log and needs --record DIR", file=sys.stderr)
        return 2
    reports = []
    note = ""
    if args.capture:
        fetcher = CaptureFetcher.from_dir(args.capture)
        cap = fetcher.capture
        lines = [ln.encode() for ln in cap.log_lines] if cap.log_lines is not None else None
        note = f"(replaying the recorded capture {args.capture}, {cap.meta.get('capture')})"
        reports.append(await examine(f"capture:{args.capture}", fetcher, args.kind,
                                     log_lines=lines))
    else:
        from twisted.web.client import HTTPConnectionPool

        # One connection per request: doctor is not the hot path, and a POST on a pooled
        # connection the engine already closed fails without a retry (twisted#7843).
        pool = HTTPConnectionPool(reactor, persistent=False)
        client = make_client(reactor, pool)
        try:
            for backend in _doctor_backends(args):
                if backend.get("docker") is not None:
                    backend["log_lines"] = await _docker_log(reactor, backend["docker"])
                http = HTTPFetcher(backend["url"], client, reactor, timeout=args.timeout)
                if args.record:
                    # Recorded before the full examination below, whose coding-agent route
                    # checks POST to the engine and would show in its counters.
                    from pharos.engine.record import record

                    report = await examine(backend["url"], http, backend["kind"])
                    command = f"pharos doctor --url {backend['url']} --record {args.record}"
                    command += " --streams" if args.streams else ""
                    command += " --log FILE --logs" if args.logs else ""
                    meta = {"engine": report.kind or "unknown",
                            "version": report.version or "unknown",
                            "command": command}
                    meta.update(dict(kv.split("=", 1) for kv in args.meta))
                    model = next(iter(report.snapshot.models or ()), None)
                    streams = (report.kind or "", model) if args.streams and model else None
                    await record(http, Path(args.record), meta, streams)
                    note = f"(recorded {backend['url']} into {args.record})"
                    if args.logs:
                        if backend["log_lines"] is None:
                            print("doctor: --logs needs the engine's log: --log FILE, or "
                                  "logs: in the config", file=sys.stderr)
                            return 2
                        written = _record_log(Path(args.record), backend["log_lines"])
                        print(f"warning: {written} recorded the engine's log as it is; engine "
                              "logs can contain prompts: review it before committing or "
                              "sharing the capture", file=sys.stderr)
                reports.append(
                    await examine(
                        backend["url"],
                        http,
                        backend["kind"],
                        own=backend["own"],
                        log_lines=backend["log_lines"],
                        capacity=backend["capacity"],
                        aliases=backend["aliases"],
                        post=lambda path, body, h=http: h.post(path, body).addCallback(
                            lambda f: f.status
                        ),
                        memory_gb=backend["memory_gb"],
                        check_memory=True,
                    )
                )
        finally:
            await pool.closeCachedConnections()
    if args.json:
        print(render_json(reports))
    else:
        print(render_text(reports, note))
    return 1 if any(r.error for r in reports) else 0


#: Lines doctor keeps of a container's log (its start-up lines come first).
DOCTOR_LOG_LINES = 200_000


async def _docker_log(reactor: IReactorTime, container: str) -> list[bytes] | None:
    """A container's log now (``docker://NAME`` feeds), read once through the Engine API on
    ``DOCKER_HOST`` or the local socket; None, with the reason on stderr, when unreadable."""
    from pharos.discovery.docker import DockerAPI, DockerLogFeed, socket_from_env

    path, why = socket_from_env(os.environ)
    if path is None:
        print(f"log feed docker://{container}: {why}", file=sys.stderr)
        return None
    lines: list[bytes] = []

    def keep(line: bytes) -> None:
        if len(lines) < DOCTOR_LOG_LINES:
            lines.append(line)

    try:
        await DockerLogFeed(DockerAPI(reactor, path), container, follow=False).connect(keep)
    except Exception as e:  # any failure of the daemon or its socket: examine without the log
        print(f"log feed docker://{container}: {e or type(e).__name__}", file=sys.stderr)
        return None
    return lines


def _record_log(directory: Path, lines: Iterable[bytes]) -> Path:
    """Write the engine's log into a capture as ``engine.log`` (a line at a time)."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "engine.log"
    with path.open("wb") as out:
        for line in lines:
            out.write(line + b"\n")
    return path


def _doctor_backends(args: argparse.Namespace) -> list[dict[str, Any]]:
    """The backends to examine: one ``--url``, or every backend of ``-c FILE``."""
    from pharos.engine.own import LogFeedUnavailable, own_probes, read_log_feed

    def lines_of(feed: Any) -> Iterable[bytes] | None:
        if feed and getattr(feed, "scheme", None) == "docker":
            return None  # read in _doctor, through the Engine API
        try:
            return read_log_feed(feed) if feed else None
        except (LogFeedUnavailable, OSError) as e:
            print(f"log feed {feed}: {e}", file=sys.stderr)
            return None

    if args.url:
        lines = lines_of(f"file://{Path(args.log).resolve()}" if args.log else None)
        return [{"url": args.url, "kind": args.kind, "own": (), "log_lines": lines,
                 "capacity": None, "aliases": {}, "memory_gb": None}]
    from pharos.config import load_config

    cfg = load_config(args.config)
    return [
        {
            "url": b.url,
            "kind": b.kind,
            "own": own_probes(b.probes),
            "log_lines": lines_of(b.logs),
            "docker": b.logs.target if b.logs and b.logs.scheme == "docker" else None,
            "capacity": b.capacity,
            "aliases": dict(b.aliases),
            "memory_gb": b.memory_gb,
        }
        for b in cfg.backends
    ]


if __name__ == "__main__":
    main()
