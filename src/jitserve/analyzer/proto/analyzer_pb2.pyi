# mypy: ignore-errors
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class LengthQuery(_message.Message):
    __slots__ = ("request_id", "prompt_tokens", "prompt_text", "app", "model", "slo_kind", "generated", "max_tokens")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TEXT_FIELD_NUMBER: _ClassVar[int]
    APP_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    SLO_KIND_FIELD_NUMBER: _ClassVar[int]
    GENERATED_FIELD_NUMBER: _ClassVar[int]
    MAX_TOKENS_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    prompt_tokens: int
    prompt_text: str
    app: str
    model: str
    slo_kind: str
    generated: int
    max_tokens: int
    def __init__(self, request_id: _Optional[str] = ..., prompt_tokens: _Optional[int] = ..., prompt_text: _Optional[str] = ..., app: _Optional[str] = ..., model: _Optional[str] = ..., slo_kind: _Optional[str] = ..., generated: _Optional[int] = ..., max_tokens: _Optional[int] = ...) -> None: ...

class PredictRequest(_message.Message):
    __slots__ = ("queries", "quantile")
    QUERIES_FIELD_NUMBER: _ClassVar[int]
    QUANTILE_FIELD_NUMBER: _ClassVar[int]
    queries: _containers.RepeatedCompositeFieldContainer[LengthQuery]
    quantile: float
    def __init__(self, queries: _Optional[_Iterable[_Union[LengthQuery, _Mapping]]] = ..., quantile: _Optional[float] = ...) -> None: ...

class LengthBound(_message.Message):
    __slots__ = ("request_id", "bound")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    BOUND_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    bound: int
    def __init__(self, request_id: _Optional[str] = ..., bound: _Optional[int] = ...) -> None: ...

class PredictResponse(_message.Message):
    __slots__ = ("bounds", "model_version")
    BOUNDS_FIELD_NUMBER: _ClassVar[int]
    MODEL_VERSION_FIELD_NUMBER: _ClassVar[int]
    bounds: _containers.RepeatedCompositeFieldContainer[LengthBound]
    model_version: int
    def __init__(self, bounds: _Optional[_Iterable[_Union[LengthBound, _Mapping]]] = ..., model_version: _Optional[int] = ...) -> None: ...

class Completion(_message.Message):
    __slots__ = ("query", "output_tokens")
    QUERY_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    query: LengthQuery
    output_tokens: int
    def __init__(self, query: _Optional[_Union[LengthQuery, _Mapping]] = ..., output_tokens: _Optional[int] = ...) -> None: ...

class ObserveRequest(_message.Message):
    __slots__ = ("completions",)
    COMPLETIONS_FIELD_NUMBER: _ClassVar[int]
    completions: _containers.RepeatedCompositeFieldContainer[Completion]
    def __init__(self, completions: _Optional[_Iterable[_Union[Completion, _Mapping]]] = ...) -> None: ...

class ObserveResponse(_message.Message):
    __slots__ = ("accepted", "buffered")
    ACCEPTED_FIELD_NUMBER: _ClassVar[int]
    BUFFERED_FIELD_NUMBER: _ClassVar[int]
    accepted: int
    buffered: int
    def __init__(self, accepted: _Optional[int] = ..., buffered: _Optional[int] = ...) -> None: ...

class Call(_message.Message):
    __slots__ = ("model", "prompt_tokens", "output_tokens")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    model: str
    prompt_tokens: int
    output_tokens: int
    def __init__(self, model: _Optional[str] = ..., prompt_tokens: _Optional[int] = ..., output_tokens: _Optional[int] = ...) -> None: ...

class StageRecord(_message.Message):
    __slots__ = ("calls", "tool", "tool_s", "stage_s")
    CALLS_FIELD_NUMBER: _ClassVar[int]
    TOOL_FIELD_NUMBER: _ClassVar[int]
    TOOL_S_FIELD_NUMBER: _ClassVar[int]
    STAGE_S_FIELD_NUMBER: _ClassVar[int]
    calls: _containers.RepeatedCompositeFieldContainer[Call]
    tool: str
    tool_s: float
    stage_s: float
    def __init__(self, calls: _Optional[_Iterable[_Union[Call, _Mapping]]] = ..., tool: _Optional[str] = ..., tool_s: _Optional[float] = ..., stage_s: _Optional[float] = ...) -> None: ...

class MatchRequest(_message.Message):
    __slots__ = ("program_id", "app", "done", "current")
    PROGRAM_ID_FIELD_NUMBER: _ClassVar[int]
    APP_FIELD_NUMBER: _ClassVar[int]
    DONE_FIELD_NUMBER: _ClassVar[int]
    CURRENT_FIELD_NUMBER: _ClassVar[int]
    program_id: str
    app: str
    done: _containers.RepeatedCompositeFieldContainer[StageRecord]
    current: StageRecord
    def __init__(self, program_id: _Optional[str] = ..., app: _Optional[str] = ..., done: _Optional[_Iterable[_Union[StageRecord, _Mapping]]] = ..., current: _Optional[_Union[StageRecord, _Mapping]] = ...) -> None: ...

class MatchResponse(_message.Message):
    __slots__ = ("share", "expected_remaining_stages", "candidates", "method")
    SHARE_FIELD_NUMBER: _ClassVar[int]
    EXPECTED_REMAINING_STAGES_FIELD_NUMBER: _ClassVar[int]
    CANDIDATES_FIELD_NUMBER: _ClassVar[int]
    METHOD_FIELD_NUMBER: _ClassVar[int]
    share: float
    expected_remaining_stages: float
    candidates: int
    method: str
    def __init__(self, share: _Optional[float] = ..., expected_remaining_stages: _Optional[float] = ..., candidates: _Optional[int] = ..., method: _Optional[str] = ...) -> None: ...

class RecordRequest(_message.Message):
    __slots__ = ("program_id", "app", "stages")
    PROGRAM_ID_FIELD_NUMBER: _ClassVar[int]
    APP_FIELD_NUMBER: _ClassVar[int]
    STAGES_FIELD_NUMBER: _ClassVar[int]
    program_id: str
    app: str
    stages: _containers.RepeatedCompositeFieldContainer[StageRecord]
    def __init__(self, program_id: _Optional[str] = ..., app: _Optional[str] = ..., stages: _Optional[_Iterable[_Union[StageRecord, _Mapping]]] = ...) -> None: ...

class RecordResponse(_message.Message):
    __slots__ = ("history_size",)
    HISTORY_SIZE_FIELD_NUMBER: _ClassVar[int]
    history_size: int
    def __init__(self, history_size: _Optional[int] = ...) -> None: ...

class StatsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class StatsResponse(_message.Message):
    __slots__ = ("model_version", "model_trained_at", "training_rows", "observed_rows", "buffered", "observed_total", "history_size", "retrains", "coverage", "mean_overestimation", "default_quantile", "ready")
    MODEL_VERSION_FIELD_NUMBER: _ClassVar[int]
    MODEL_TRAINED_AT_FIELD_NUMBER: _ClassVar[int]
    TRAINING_ROWS_FIELD_NUMBER: _ClassVar[int]
    OBSERVED_ROWS_FIELD_NUMBER: _ClassVar[int]
    BUFFERED_FIELD_NUMBER: _ClassVar[int]
    OBSERVED_TOTAL_FIELD_NUMBER: _ClassVar[int]
    HISTORY_SIZE_FIELD_NUMBER: _ClassVar[int]
    RETRAINS_FIELD_NUMBER: _ClassVar[int]
    COVERAGE_FIELD_NUMBER: _ClassVar[int]
    MEAN_OVERESTIMATION_FIELD_NUMBER: _ClassVar[int]
    DEFAULT_QUANTILE_FIELD_NUMBER: _ClassVar[int]
    READY_FIELD_NUMBER: _ClassVar[int]
    model_version: int
    model_trained_at: float
    training_rows: int
    observed_rows: int
    buffered: int
    observed_total: int
    history_size: int
    retrains: int
    coverage: float
    mean_overestimation: float
    default_quantile: float
    ready: bool
    def __init__(self, model_version: _Optional[int] = ..., model_trained_at: _Optional[float] = ..., training_rows: _Optional[int] = ..., observed_rows: _Optional[int] = ..., buffered: _Optional[int] = ..., observed_total: _Optional[int] = ..., history_size: _Optional[int] = ..., retrains: _Optional[int] = ..., coverage: _Optional[float] = ..., mean_overestimation: _Optional[float] = ..., default_quantile: _Optional[float] = ..., ready: _Optional[bool] = ...) -> None: ...

class StoredStage(_message.Message):
    __slots__ = ("models", "calls", "input_tokens", "output_tokens", "tool", "tool_ms", "stage_ms")
    MODELS_FIELD_NUMBER: _ClassVar[int]
    CALLS_FIELD_NUMBER: _ClassVar[int]
    INPUT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    TOOL_FIELD_NUMBER: _ClassVar[int]
    TOOL_MS_FIELD_NUMBER: _ClassVar[int]
    STAGE_MS_FIELD_NUMBER: _ClassVar[int]
    models: _containers.RepeatedScalarFieldContainer[int]
    calls: int
    input_tokens: int
    output_tokens: int
    tool: int
    tool_ms: int
    stage_ms: int
    def __init__(self, models: _Optional[_Iterable[int]] = ..., calls: _Optional[int] = ..., input_tokens: _Optional[int] = ..., output_tokens: _Optional[int] = ..., tool: _Optional[int] = ..., tool_ms: _Optional[int] = ..., stage_ms: _Optional[int] = ...) -> None: ...

class StoredGraph(_message.Message):
    __slots__ = ("app", "stages", "weight", "last_used_s")
    APP_FIELD_NUMBER: _ClassVar[int]
    STAGES_FIELD_NUMBER: _ClassVar[int]
    WEIGHT_FIELD_NUMBER: _ClassVar[int]
    LAST_USED_S_FIELD_NUMBER: _ClassVar[int]
    app: int
    stages: _containers.RepeatedCompositeFieldContainer[StoredStage]
    weight: float
    last_used_s: float
    def __init__(self, app: _Optional[int] = ..., stages: _Optional[_Iterable[_Union[StoredStage, _Mapping]]] = ..., weight: _Optional[float] = ..., last_used_s: _Optional[float] = ...) -> None: ...

class StoredHistory(_message.Message):
    __slots__ = ("format", "names", "graphs")
    FORMAT_FIELD_NUMBER: _ClassVar[int]
    NAMES_FIELD_NUMBER: _ClassVar[int]
    GRAPHS_FIELD_NUMBER: _ClassVar[int]
    format: int
    names: _containers.RepeatedScalarFieldContainer[str]
    graphs: _containers.RepeatedCompositeFieldContainer[StoredGraph]
    def __init__(self, format: _Optional[int] = ..., names: _Optional[_Iterable[str]] = ..., graphs: _Optional[_Iterable[_Union[StoredGraph, _Mapping]]] = ...) -> None: ...
