"""The gRPC service over a real loopback server (no mocks)."""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from jitserve.analyzer import state
from jitserve.analyzer.client import make_stub, match_pb, record_pb
from jitserve.analyzer.corpus import program_corpus
from jitserve.analyzer.graphs import summarize_program
from jitserve.analyzer.proto import analyzer_pb2 as pb
from jitserve.analyzer.qrf_model import LengthModel, LengthQuery
from jitserve.analyzer.service import SERVICE_NAME
from jitserve.analyzer.service_config import ServiceConfig
from jitserve.analyzer.service_core import AnalyzerCore
from tests.support.analyzer import RunningAnalyzer, start_analyzer

TIMEOUT = 5.0


@pytest.fixture
def channel(analyzer: RunningAnalyzer) -> Iterator[grpc.Channel]:
    with grpc.insecure_channel(analyzer.target) as ch:
        yield ch


@pytest.fixture
def stub(channel: grpc.Channel) -> Any:
    return make_stub(channel)


def _query(i: int = 0, **kw: Any) -> pb.LengthQuery:
    fields: dict[str, Any] = {"request_id": f"q{i}", "prompt_tokens": 200, "app": "chat"}
    fields.update(kw)
    return pb.LengthQuery(**fields)


def _invalid(call: Any, message: Any, *fragments: str) -> None:
    with pytest.raises(grpc.RpcError) as info:
        call(message, timeout=TIMEOUT)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT, info.value.details()
    for fragment in fragments:
        assert fragment in info.value.details()


def test_health_is_serving(channel: grpc.Channel) -> None:
    health = health_pb2_grpc.HealthStub(channel)
    for service in ("", SERVICE_NAME):
        reply = health.Check(health_pb2.HealthCheckRequest(service=service), timeout=TIMEOUT)
        assert reply.status == health_pb2.HealthCheckResponse.SERVING


def test_predict_and_refine_match_the_model(stub: Any, small_model: LengthModel) -> None:
    queries = [_query(1, app="code", prompt_tokens=3000),
               _query(2, app="reasoning", prompt_tokens=90, prompt_text="prove that it holds:")]
    reply = stub.PredictBound(pb.PredictRequest(queries=queries), timeout=TIMEOUT)
    expected = small_model.bounds(
        [LengthQuery(3000, "code", "default", ""),
         LengthQuery(90, "reasoning", "default", "", "prove that it holds:")], 0.95)
    assert [b.bound for b in reply.bounds] == expected
    assert [b.request_id for b in reply.bounds] == ["q1", "q2"]
    assert reply.model_version == small_model.version
    lower = stub.PredictBound(pb.PredictRequest(queries=queries, quantile=0.5), timeout=TIMEOUT)
    assert all(a.bound < b.bound for a, b in zip(lower.bounds, reply.bounds, strict=True))
    refined = stub.Refine(pb.PredictRequest(queries=[_query(1, app="code", prompt_tokens=3000,
                                                            generated=4000)]), timeout=TIMEOUT)
    assert refined.bounds[0].bound > 4000


def test_observe_feeds_buffer_and_coverage_metrics(analyzer: RunningAnalyzer, stub: Any) -> None:
    before = analyzer.core.stats().buffered
    queries = [_query(100 + i, app="summarize", prompt_tokens=2500) for i in range(4)]
    bounds = stub.PredictBound(pb.PredictRequest(queries=queries), timeout=TIMEOUT).bounds
    completions = [pb.Completion(query=q, output_tokens=b.bound // 2)
                   for q, b in zip(queries[:3], bounds, strict=False)]
    completions.append(pb.Completion(query=queries[3], output_tokens=bounds[3].bound * 4))
    reply = stub.ObserveCompletion(pb.ObserveRequest(completions=completions), timeout=TIMEOUT)
    assert reply.accepted == 4 and reply.buffered == before + 4
    stats = stub.Stats(pb.StatsRequest(), timeout=TIMEOUT)
    assert stats.ready and stats.buffered == before + 4 and stats.coverage == pytest.approx(0.75)
    registry = analyzer.core.metrics.registry
    assert registry.get_sample_value("jitserve_analyzer_coverage") == pytest.approx(0.75)
    over = registry.get_sample_value("jitserve_analyzer_overestimation_ratio")
    assert over is not None and 1.0 < over < 2.0
    assert registry.get_sample_value("jitserve_analyzer_prediction_seconds_count") >= 1
    assert registry.get_sample_value("jitserve_analyzer_buffer_size") == before + 4


def test_record_and_match_programs(analyzer: RunningAnalyzer, stub: Any) -> None:
    programs = program_corpus(20, 11)
    for program, seconds in programs:
        size = stub.RecordProgram(record_pb(program, seconds), timeout=TIMEOUT).history_size
    assert size == len(analyzer.core.history) >= 20
    program, _ = programs[0]
    reply = stub.MatchProgram(match_pb(program, 1), timeout=TIMEOUT)
    assert reply.method == "structure" and reply.candidates >= 1
    assert 0 < reply.share <= 1 and reply.expected_remaining_stages >= 0
    registry = analyzer.core.metrics.registry
    assert registry.get_sample_value("jitserve_analyzer_history_size") == size


INVALID_PREDICTS = [
    (pb.PredictRequest(), ("queries", "empty")),
    (pb.PredictRequest(queries=[_query(prompt_tokens=0)]), ("queries[0].prompt_tokens",)),
    (pb.PredictRequest(queries=[_query(), _query(generated=-3)]), ("queries[1].generated",)),
    (pb.PredictRequest(queries=[_query(slo_kind="urgent")]), ("slo_kind",)),
    (pb.PredictRequest(queries=[_query(app="x" * 300)]), ("queries[0].app",)),
    (pb.PredictRequest(queries=[_query(prompt_text="y" * 70_000)]), ("prompt_text", "65536")),
    (pb.PredictRequest(queries=[_query()], quantile=1.5), ("quantile",)),
    (pb.PredictRequest(queries=[_query()], quantile=math.nan), ("quantile",)),
    (pb.PredictRequest(queries=[_query(i) for i in range(257)]), ("batch of 257", "256")),
]


@pytest.mark.parametrize(("message", "fragments"), INVALID_PREDICTS)
def test_invalid_predictions_are_refused(stub: Any, message: pb.PredictRequest,
                                         fragments: tuple[str, ...]) -> None:
    _invalid(stub.PredictBound, message, *fragments)


def test_invalid_programs_and_completions_are_refused(analyzer: RunningAnalyzer,
                                                      stub: Any) -> None:
    program, seconds = program_corpus(1, 3)[0]
    bad_time = record_pb(program, seconds)
    bad_time.stages[0].stage_s = math.inf
    _invalid(stub.RecordProgram, bad_time, "stages[0].stage_s")
    _invalid(stub.RecordProgram, pb.RecordRequest(app="a"), "stages", "at least one")
    empty_stage = record_pb(program, seconds)
    del empty_stage.stages[1].calls[:]
    _invalid(stub.RecordProgram, empty_stage, "stages[1].calls")
    _invalid(stub.RecordProgram, pb.RecordRequest(stages=[bad_time.stages[1]] * 65), "65")
    _invalid(stub.MatchProgram, pb.MatchRequest(app="research"), "current", "missing")
    negative = match_pb(program, 1)
    negative.done[0].calls[0].prompt_tokens = -1
    _invalid(stub.MatchProgram, negative, "done[0].calls[0].prompt_tokens")
    _invalid(stub.ObserveCompletion, pb.ObserveRequest(completions=[pb.Completion(
        query=_query(), output_tokens=0)]), "completions[0].output_tokens")
    _invalid(stub.ObserveCompletion, pb.ObserveRequest(completions=[pb.Completion(
        output_tokens=5)]), "completions[0].query", "missing")
    counted = analyzer.core.metrics.registry.get_sample_value(
        "jitserve_analyzer_invalid_requests_total", {"rpc": "RecordProgram"})
    assert counted is not None and counted >= 4


def test_bytes_that_do_not_parse_are_invalid_argument(channel: grpc.Channel, stub: Any) -> None:
    raw = channel.unary_unary(f"/{SERVICE_NAME}/PredictBound",
                              request_serializer=lambda b: b, response_deserializer=lambda b: b)
    for garbage in (b"\xff\xff\xff\xff\xff", b"\x0a\x05ab"):
        with pytest.raises(grpc.RpcError) as info:
            raw(garbage, timeout=TIMEOUT)
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "malformed PredictRequest" in info.value.details()
    # the server is unharmed
    assert stub.PredictBound(pb.PredictRequest(queries=[_query()]), timeout=TIMEOUT).bounds


def test_messages_over_the_transport_limit_are_refused(stub: Any) -> None:
    huge = pb.PredictRequest(queries=[_query(prompt_text="z" * 60_000)] * 20)  # ~1.2 MB > 1 MiB
    with pytest.raises(grpc.RpcError) as info:
        stub.PredictBound(huge, timeout=TIMEOUT)
    assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert stub.PredictBound(pb.PredictRequest(queries=[_query()]), timeout=TIMEOUT).bounds


def test_not_serving_and_unavailable_until_the_model_is_loaded(small_model: LengthModel) -> None:
    running = start_analyzer(None)
    try:
        with grpc.insecure_channel(running.target) as ch:
            health = health_pb2_grpc.HealthStub(ch)
            check = health_pb2.HealthCheckRequest(service=SERVICE_NAME)
            assert health.Check(check, timeout=TIMEOUT).status == \
                health_pb2.HealthCheckResponse.NOT_SERVING
            stub = make_stub(ch)
            with pytest.raises(grpc.RpcError) as info:
                stub.PredictBound(pb.PredictRequest(queries=[_query()]), timeout=TIMEOUT)
            assert info.value.code() == grpc.StatusCode.UNAVAILABLE
            assert "loading" in info.value.details()
            assert not stub.Stats(pb.StatsRequest(), timeout=TIMEOUT).ready
            running.core.use_model(small_model)
            deadline = time.monotonic() + TIMEOUT
            while health.Check(check, timeout=TIMEOUT).status != \
                    health_pb2.HealthCheckResponse.SERVING:
                assert time.monotonic() < deadline
                time.sleep(0.01)
            assert stub.PredictBound(pb.PredictRequest(queries=[_query()]), timeout=TIMEOUT).bounds
    finally:
        running.server.stop(0).wait()


def test_background_worker_retrains_and_swaps(small_model: LengthModel) -> None:
    running = start_analyzer(small_model, retrain_min_new=30, retrain_interval_s=0.0,
                             corpus_size=400)
    try:
        core = running.core
        completions = [("", LengthQuery(100 + i, "batch"), 700 + i) for i in range(40)]
        core.observe(completions)
        core.maintain()
        assert core.retrains == 1 and core.model.version == small_model.version + 1
        assert core.model.observed_rows == 40
        assert core.metrics.registry.get_sample_value("jitserve_analyzer_retrains_total") == 1
        assert core.metrics.registry.get_sample_value("jitserve_analyzer_model_version") == 2
        core.maintain()  # nothing new: no retrain
        assert core.retrains == 1
    finally:
        running.server.stop(0).wait()


def test_unusable_checkpoints_start_fresh_without_stopping(
        tmp_path: Path, small_model: LengthModel, caplog: pytest.LogCaptureFixture) -> None:
    core = AnalyzerCore(ServiceConfig(state_dir=tmp_path, corpus_size=400))
    core.start(background=False)
    core.observe([("", LengthQuery(100, "batch"), 50)])
    core.record("research", "p", summarize_program(*program_corpus(1, 5)[0]))
    core.use_model(small_model)
    core.checkpoint()
    (tmp_path / state.MODEL_FILE).write_bytes(b"definitely not a pickle")
    (tmp_path / state.HISTORY_FILE).write_bytes(b"\xff\xfe garbage")
    fresh = AnalyzerCore(ServiceConfig(state_dir=tmp_path, corpus_size=400))
    with caplog.at_level(logging.INFO, logger="jitserve.analyzer"):
        fresh.start(background=False)
    stats = fresh.stats()
    assert stats.ready and stats.model_version == 1 and stats.history_size == 0
    assert stats.buffered == 1  # the intact buffer is kept
    assert f"{state.MODEL_FILE} is unusable" in caplog.text
    assert f"{state.HISTORY_FILE} is unusable" in caplog.text
    assert (tmp_path / (state.MODEL_FILE + ".corrupt")).exists()
    assert fresh.stats().ready


def test_refinement_reuses_the_curve_of_a_request_in_flight(analyzer: RunningAnalyzer,
                                                            stub: Any) -> None:
    query = _query(900, app="research", prompt_tokens=2000, prompt_text="outline a plan")
    first = stub.PredictBound(pb.PredictRequest(queries=[query]), timeout=TIMEOUT).bounds[0]
    assert "q900" in analyzer.core._curves
    query.generated = first.bound + 10
    refined = stub.Refine(pb.PredictRequest(queries=[query]), timeout=TIMEOUT).bounds[0]
    assert refined.bound > first.bound + 10
    stub.ObserveCompletion(pb.ObserveRequest(completions=[pb.Completion(
        query=query, output_tokens=first.bound + 20)]), timeout=TIMEOUT)
    assert "q900" not in analyzer.core._curves
