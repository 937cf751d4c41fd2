"""Checkpoints of the analyzer's learned state in a directory (a volume in Kubernetes).

Who owns what: the service decides *when* to checkpoint (after a retrain, periodically
when something changed, on shutdown); this module owns the *format* and the rule that
a missing or unreadable file never stops the service — it logs one clear line, moves a
corrupt file aside (``NAME.corrupt``) and the caller starts that part fresh.

Files (each written atomically: temporary file, fsync, rename):
- ``model.pkl``: the :class:`~jitserve.analyzer.qrf_model.LengthModel` (pickle; the state
  directory is trusted — it is the service's own volume);
- ``buffer.json.gz``: the observed completions awaiting/used for training (prompt text
  cut to the words the features read);
- ``history.pb``: the pattern-graph history (``StoredHistory`` protobuf, names interned).
"""

from __future__ import annotations

import gzip
import json
import logging
import os
import pickle
import tempfile
from collections.abc import Callable, Iterable
from pathlib import Path

from google.protobuf.message import DecodeError

from jitserve.analyzer.corpus import LengthRecord
from jitserve.analyzer.features import words
from jitserve.analyzer.graphs import StageSummary
from jitserve.analyzer.matcher import PatternHistory
from jitserve.analyzer.proto import analyzer_pb2 as pb
from jitserve.analyzer.qrf_model import LengthModel

log = logging.getLogger("jitserve.analyzer.state")

FORMAT = 1
MODEL_FILE = "model.pkl"
BUFFER_FILE = "buffer.json.gz"
HISTORY_FILE = "history.pb"


class CheckpointError(Exception):
    """A checkpoint file exists but cannot be used."""


def _atomic_write(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _quarantine(path: Path, reason: str) -> None:
    target = path.with_name(path.name + ".corrupt")
    try:
        os.replace(path, target)
        moved = f"; moved it to {target.name}"
    except OSError:
        moved = ""
    log.error("checkpoint %s is unusable (%s)%s; starting that part fresh", path, reason, moved)


# --- model ------------------------------------------------------------------------------


def save_model(state_dir: Path, model: LengthModel) -> None:
    payload = {"format": FORMAT, "model": model}
    _atomic_write(state_dir / MODEL_FILE, pickle.dumps(payload, protocol=pickle.HIGHEST_PROTOCOL))


def load_model(state_dir: Path) -> LengthModel | None:
    path = state_dir / MODEL_FILE
    if not path.exists():
        log.info("no model checkpoint in %s; training from the corpus", state_dir)
        return None
    try:
        with path.open("rb") as handle:
            payload = pickle.load(handle)
        if not isinstance(payload, dict):
            raise CheckpointError(f"expected a dict, got {type(payload).__name__}")
        if payload.get("format") != FORMAT:
            raise CheckpointError(f"unknown format {payload.get('format')!r}")
        model = payload["model"]
        if not isinstance(model, LengthModel):
            raise CheckpointError(f"expected a LengthModel, got {type(model).__name__}")
        return model
    except Exception as err:
        _quarantine(path, f"{type(err).__name__}: {err}")
        return None


# --- observation buffer -----------------------------------------------------------------


def compact_text(text: str | None) -> str | None:
    """The part of a prompt the features read (bounded size in buffer and checkpoint)."""
    return " ".join(words(text)) if text else None


def save_buffer(state_dir: Path, records: Iterable[LengthRecord], total: int) -> None:
    rows = [[r.prompt_text, r.prompt_tokens, r.output_tokens, r.app, r.model, r.slo_kind]
            for r in records]
    data = json.dumps({"format": FORMAT, "total": total, "rows": rows}, separators=(",", ":"))
    _atomic_write(state_dir / BUFFER_FILE, gzip.compress(data.encode(), compresslevel=1))


def load_buffer(state_dir: Path) -> tuple[list[LengthRecord], int] | None:
    path = state_dir / BUFFER_FILE
    if not path.exists():
        log.info("no observation buffer in %s; starting empty", state_dir)
        return None
    try:
        payload = json.loads(gzip.decompress(path.read_bytes()))
        if payload.get("format") != FORMAT:
            raise CheckpointError(f"unknown format {payload.get('format')}")
        records = [
            LengthRecord(None if text is None else str(text), int(p), int(o), str(a), str(m),
                         str(k))
            for text, p, o, a, m, k in payload["rows"]
        ]
        return records, int(payload["total"])
    except Exception as err:
        _quarantine(path, f"{type(err).__name__}: {err}")
        return None


# --- pattern-graph history --------------------------------------------------------------


def history_message(history: PatternHistory) -> pb.StoredHistory:
    names: dict[str, int] = {}

    def intern(name: str) -> int:
        return names.setdefault(name, len(names))

    message = pb.StoredHistory(format=FORMAT)
    with history.lock:
        for entry in history.entries:
            graph = message.graphs.add(app=intern(entry.app), weight=entry.weight,
                                       last_used_s=entry.last_used_s)
            for st in entry.stages:
                graph.stages.add(
                    models=[intern(m) for m in st.models], calls=st.calls,
                    input_tokens=st.input_tokens, output_tokens=st.output_tokens,
                    tool=intern(st.tool), tool_ms=min(2**32 - 1, round(st.tool_s * 1000)),
                    stage_ms=min(2**32 - 1, round(st.stage_s * 1000)),
                )
    message.names.extend(names)
    return message


def graph_size_bytes(entry_stages: Iterable[StageSummary], app: str) -> int:
    """Size of one stored graph (with its own name table) — the 1 KB budget."""
    history = PatternHistory(capacity=1)
    history.add(list(entry_stages), app)
    return int(history_message(history).ByteSize())


def save_history(state_dir: Path, history: PatternHistory) -> None:
    _atomic_write(state_dir / HISTORY_FILE, history_message(history).SerializeToString())


def restore_history(message: pb.StoredHistory, history: PatternHistory) -> int:
    if message.format != FORMAT:
        raise CheckpointError(f"unknown format {message.format}")
    names = list(message.names)
    restored = 0
    for graph in message.graphs:
        stages = [
            StageSummary(models=tuple(names[m] for m in st.models), calls=st.calls,
                         input_tokens=st.input_tokens, output_tokens=st.output_tokens,
                         tool=names[st.tool], tool_s=st.tool_ms / 1000, stage_s=st.stage_ms / 1000)
            for st in graph.stages
        ]
        history.add(stages, names[graph.app], weight=graph.weight, last_used_s=graph.last_used_s)
        restored += 1
    return restored


def load_history(state_dir: Path, make: Callable[[], PatternHistory]) -> PatternHistory | None:
    """A history built by ``make`` and filled from the checkpoint, or None."""
    path = state_dir / HISTORY_FILE
    if not path.exists():
        log.info("no pattern-graph history in %s; starting empty", state_dir)
        return None
    try:
        message = pb.StoredHistory.FromString(path.read_bytes())
        history = make()
        restore_history(message, history)
        return history
    except (DecodeError, CheckpointError, IndexError, ValueError) as err:
        _quarantine(path, f"{type(err).__name__}: {err}")
        return None
