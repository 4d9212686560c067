"""Starts an SGLang server as its own process group, reports its start-up phase, and never leaves it behind.

An SGLang start with a large target and an EAGLE-3 draft takes 10-15 minutes and the HTTP port stays closed
until the very end, so we read the phase from the server's log (strings from the 0.5.23 source: model_runner
"Load weight begin/end", kv_cache_configurator "Memory pool end", cuda_graph_setup / eagle_worker_v2
"Capture <role> ... CUDA graph begin", http_server "fired up and ready to roll") and, once the port is
bound, from /health (503 = warm-up, 200 = ready). Each phase's time goes to the log and to
`reporter.metrics` as `bench/startup/<phase>_s`, the total as `bench/startup_s`.

Cleanup: the server gets `start_new_session=True`, so its scheduler/detokenizer children share its process
group and one killpg ends them all. Every live server is also registered for atexit and SIGTERM cleanup.
"""

from __future__ import annotations

import atexit
import logging
import os
import re
import signal
import socket
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections import deque
from pathlib import Path

log = logging.getLogger("draftlab.sglang")

PHASES = ("launch", "target_weights", "memory_pool", "draft_weights", "cuda_graph_target", "cuda_graph_draft",
          "warmup", "ready")
_WEIGHT_BEGIN = re.compile(r"load weight begin", re.I)
_WEIGHT_END = re.compile(r"load weight end", re.I)
_MEMORY = re.compile(r"memory pool (begin|end)|kv cache is allocated", re.I)
# 0.5.23: "Capture target verify CUDA graph begin", "Capture draft decode CUDA graph begin";
# older releases: "Capture cuda graph begin", "Capture draft cuda graph begin".
_GRAPH = re.compile(r"capture\b.*\bcuda graph begin", re.I)
_WARMUP = re.compile(r"uvicorn running on|application startup complete", re.I)
_READY = re.compile(r"fired up and ready to roll", re.I)
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # loopback never goes through a proxy


def exit_reason(code: int) -> str:
    """How a server process ended, in words: a signal by name, with SIGKILL's two usual senders."""
    if code >= 0:
        return f"exited with status {code}"
    try:
        name = signal.Signals(-code).name
    except ValueError:
        return f"was killed by signal {-code}"
    # SGLang kills its own process tree when a child fails (srt/utils/common.py, kill_process_tree)
    hint = (" (SGLang does this when one of its processes fails: the log tail above it says why; else the kernel's"
            " out-of-memory killer: `dmesg` says)")
    return f"was killed by {name}" + (hint if -code == signal.SIGKILL else "")


class ServerStartError(RuntimeError):
    """The server crashed or did not become ready; carries the phase reached and the log tail."""

    def __init__(self, message: str, phase: str, log_tail: str):
        super().__init__(f"{message} (phase reached: {phase})\n--- server log tail ---\n{log_tail}")
        self.phase = phase
        self.log_tail = log_tail


class PortInUseError(ServerStartError):
    pass


def port_in_use(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.settimeout(0.5)
        return sock.connect_ex((host, port)) == 0


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


class PhaseTracker:
    """Turns log lines and /health answers into the current phase and the seconds spent in each."""

    def __init__(self, clock=time.monotonic):
        self.clock = clock
        self.start = clock()
        self.phase = "launch"
        self.since = self.start
        self.seconds: dict[str, float] = {}
        self.loads_begun = 0

    def enter(self, phase: str) -> bool:
        if phase == self.phase:
            return False
        now = self.clock()
        self.seconds[self.phase] = self.seconds.get(self.phase, 0.0) + now - self.since
        log.info("sglang start-up: %s -> %s after %.1f s (total %.1f s)", self.phase, phase, now - self.since,
                 now - self.start)
        self.phase, self.since = phase, now
        return True

    def feed(self, line: str) -> None:
        if self.phase in ("warmup", "ready"):
            if _READY.search(line):
                self.enter("ready")
            return
        if _WEIGHT_BEGIN.search(line):
            self.loads_begun += 1
            self.enter("target_weights" if self.loads_begun == 1 else "draft_weights")
        elif _WEIGHT_END.search(line) or _MEMORY.search(line):
            self.enter("memory_pool")
        elif _GRAPH.search(line):
            self.enter("cuda_graph_draft" if "draft" in line.lower() else "cuda_graph_target")
        elif _WARMUP.search(line):
            self.enter("warmup")
        elif _READY.search(line):
            self.enter("ready")

    def total(self) -> float:
        return self.clock() - self.start

    def metrics(self, prefix: str = "bench/startup") -> dict[str, float]:
        out = {f"{prefix}/{p}_s": round(s, 3) for p, s in self.seconds.items() if p != "ready"}
        out[f"{prefix}_s"] = round(self.total(), 3)
        return out


_LIVE: set["SGLangServer"] = set()
_LIVE_LOCK = threading.Lock()
_HANDLERS_INSTALLED = False


def _cleanup_all() -> None:
    with _LIVE_LOCK:
        servers = list(_LIVE)
    for server in servers:
        server.stop()


def _on_sigterm(signum, frame):  # noqa: ARG001
    _cleanup_all()
    raise SystemExit(128 + signum)


def _install_handlers() -> None:
    global _HANDLERS_INSTALLED
    if _HANDLERS_INSTALLED:
        return
    atexit.register(_cleanup_all)
    # Only the main thread may set handlers; a custom SIGTERM handler set by the host program is kept.
    if threading.current_thread() is threading.main_thread() and signal.getsignal(signal.SIGTERM) == signal.SIG_DFL:
        signal.signal(signal.SIGTERM, _on_sigterm)
    _HANDLERS_INSTALLED = True


class SGLangServer:
    """`with SGLangServer(argv, log_path, host, port, timeout_s) as server:` -> ready server, always cleaned up."""

    def __init__(self, argv: list[str], log_path: Path, host: str = "127.0.0.1", port: int = 30000,
                 timeout_s: float = 1200.0, reporter=None, env: dict | None = None, poll_s: float = 0.2,
                 grace_s: float = 5.0, name: str = "sglang", metric_prefix: str = "bench/startup"):
        if not isinstance(argv, list):
            raise TypeError("argv must be a list of arguments, never a shell string")
        self.argv, self.log_path, self.host, self.port = argv, Path(log_path), host, int(port)
        self.timeout_s, self.reporter, self.env = timeout_s, reporter, env
        self.poll_s, self.grace_s, self.name, self.metric_prefix = poll_s, grace_s, name, metric_prefix
        self.proc: subprocess.Popen | None = None
        self.tracker: PhaseTracker | None = None
        self._tail: deque[str] = deque(maxlen=60)
        self._pos = 0
        self._partial = ""

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self) -> None:
        if port_in_use(self.host, self.port):
            raise PortInUseError(f"{self.name}: {self.host}:{self.port} is already in use; pick another serve.port "
                                 "or stop the process holding it", "launch", "")
        _install_handlers()
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        env = dict(os.environ if self.env is None else self.env)
        env.setdefault("PYTHONUNBUFFERED", "1")  # log lines must reach the file as they happen
        with open(self.log_path, "ab") as handle:
            self.proc = subprocess.Popen(self.argv, stdout=handle, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                         start_new_session=True, env=env)
        with _LIVE_LOCK:
            _LIVE.add(self)
        self.tracker = PhaseTracker()
        log.info("%s: started pid %d, log %s", self.name, self.proc.pid, self.log_path)

    def _read_log(self) -> None:
        try:
            with open(self.log_path, "rb") as handle:
                handle.seek(self._pos)
                chunk = handle.read()
                self._pos = handle.tell()
        except FileNotFoundError:
            return
        # tqdm progress uses carriage returns; treat them as line ends.
        text = self._partial + chunk.decode("utf-8", "replace").replace("\r", "\n")
        lines = text.split("\n")
        self._partial = lines.pop()
        for line in lines:
            if line.strip():
                self._tail.append(line)
                self.tracker.feed(line)

    def _health(self) -> int | None:
        try:
            with _OPENER.open(self.url + "/health", timeout=2) as resp:
                return resp.status
        except urllib.error.HTTPError as err:
            return err.code
        except (urllib.error.URLError, OSError):
            return None

    def log_tail(self) -> str:
        self._read_log()
        return "\n".join(self._tail)

    def wait_ready(self) -> dict[str, float]:
        deadline = time.monotonic() + self.timeout_s
        while True:
            self._read_log()
            code = self.proc.poll()
            if code is not None:
                phase = self.tracker.phase
                self.stop()
                raise ServerStartError(f"{self.name}: server {exit_reason(code)} during start-up", phase,
                                       self.log_tail())
            status = self._health()
            if status == 200:
                self.tracker.enter("ready")
                break
            if status is not None and self.tracker.phase != "warmup":
                self.tracker.enter("warmup")  # the port is bound only after the scheduler is ready
            if time.monotonic() > deadline:
                phase = self.tracker.phase
                self.stop()
                raise ServerStartError(f"{self.name}: not ready after {self.timeout_s:.0f} s", phase, self.log_tail())
            time.sleep(self.poll_s)
        metrics = self.tracker.metrics(self.metric_prefix)
        log.info("%s: ready in %.1f s (%s)", self.name, metrics[f"{self.metric_prefix}_s"],
                 ", ".join(f"{k.split('/')[-1]}={v:.1f}" for k, v in metrics.items() if k != f"{self.metric_prefix}_s"))
        if self.reporter is not None:
            self.reporter.metrics(metrics)
        return metrics

    def stop(self) -> None:
        """SIGTERM to the whole process group, SIGKILL after grace_s; returns once the group is gone."""
        proc = self.proc
        if proc is None:
            return
        pgid = proc.pid  # start_new_session: the leader's pid is the group id
        for sig, wait_s in ((signal.SIGTERM, self.grace_s), (signal.SIGKILL, 5.0)):
            try:
                os.killpg(pgid, sig)
            except ProcessLookupError:
                break
            end = time.monotonic() + wait_s
            while time.monotonic() < end:
                proc.poll()  # reap the leader so the group can empty
                if not group_alive(pgid):
                    break
                time.sleep(0.05)
            if not group_alive(pgid):
                break
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            log.error("%s: pid %d did not exit after SIGKILL", self.name, proc.pid)
        with _LIVE_LOCK:
            _LIVE.discard(self)

    def __enter__(self) -> "SGLangServer":
        self.start()
        try:
            self.wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def group_alive(pgid: int) -> bool:
    """True while any process of the group exists (zombies of our own children count until reaped)."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
