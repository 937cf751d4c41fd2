from __future__ import annotations

import gzip
import logging
import pickle
from pathlib import Path

import pytest

from jitserve.analyzer import state
from jitserve.analyzer.corpus import LengthRecord, program_corpus
from jitserve.analyzer.graphs import summarize_program
from jitserve.analyzer.matcher import PatternHistory
from jitserve.analyzer.qrf_model import LengthModel, LengthQuery


def test_model_round_trip(tmp_path: Path, small_model: LengthModel) -> None:
    state.save_model(tmp_path, small_model)
    loaded = state.load_model(tmp_path)
    assert loaded is not None and loaded.version == small_model.version
    queries = [LengthQuery(800, "summarize"), LengthQuery(50, "chat", prompt_text="list 12 tips")]
    assert loaded.bounds(queries, 0.95) == small_model.bounds(queries, 0.95)


@pytest.mark.parametrize("content", [b"not a pickle", pickle.dumps({"format": 99}),
                                     pickle.dumps(["wrong"])])
def test_unusable_model_checkpoint_is_moved_aside(tmp_path: Path, content: bytes,
                                                  caplog: pytest.LogCaptureFixture) -> None:
    (tmp_path / state.MODEL_FILE).write_bytes(content)
    with caplog.at_level(logging.ERROR, logger="jitserve.analyzer.state"):
        assert state.load_model(tmp_path) is None
    assert "unusable" in caplog.text and "starting that part fresh" in caplog.text
    assert (tmp_path / (state.MODEL_FILE + ".corrupt")).exists()
    assert not (tmp_path / state.MODEL_FILE).exists()


def test_missing_checkpoints_start_fresh(tmp_path: Path) -> None:
    assert state.load_model(tmp_path) is None
    assert state.load_buffer(tmp_path) is None
    assert state.load_history(tmp_path, PatternHistory) is None


def test_buffer_round_trip_and_corruption(tmp_path: Path) -> None:
    records = [LengthRecord("tl;dr", 10, 5, "chat", "m", "latency"),
               LengthRecord(None, 99, 500, "batch", "default", "")]
    state.save_buffer(tmp_path, records, total=7)
    assert state.load_buffer(tmp_path) == (records, 7)
    (tmp_path / state.BUFFER_FILE).write_bytes(gzip.compress(b'{"format": 1, "rows": [[1]]}'))
    assert state.load_buffer(tmp_path) is None
    assert (tmp_path / (state.BUFFER_FILE + ".corrupt")).exists()


def test_compact_text_keeps_what_the_features_read() -> None:
    long = "summarize this " + " ".join(["w"] * 5000) + " in one sentence"
    compact = state.compact_text(long)
    assert compact is not None and len(compact) < 300
    assert compact.startswith("summarize this") and compact.endswith("in one sentence")


def test_history_round_trip_keeps_matches_and_weights(tmp_path: Path) -> None:
    history = PatternHistory()
    programs = program_corpus(30, 2)
    for program, seconds in programs:
        history.add(summarize_program(program, seconds), program.app, weight=1.5)
    state.save_history(tmp_path, history)
    restored = state.load_history(tmp_path, PatternHistory)
    assert restored is not None and len(restored) == 30
    assert restored.entries[3].weight == pytest.approx(1.5)
    for program, _ in programs[:5]:
        visible = summarize_program(program, known_outputs=1)
        a = history.match(program.app, visible[:1], visible[1], touch=False)
        b = restored.match(program.app, visible[:1], visible[1], touch=False)
        assert a.share == pytest.approx(b.share, abs=1e-3)


def test_corrupt_history_is_moved_aside(tmp_path: Path) -> None:
    (tmp_path / state.HISTORY_FILE).write_bytes(b"\xff\xff\xff\xff garbage")
    assert state.load_history(tmp_path, PatternHistory) is None
    assert (tmp_path / (state.HISTORY_FILE + ".corrupt")).exists()
