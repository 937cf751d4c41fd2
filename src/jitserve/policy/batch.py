"""The batch shape of a serving pod: vLLM's slots B and the sidecar's view of them.

vLLM runs at most ``--max-num-seqs`` (B) sequences; the sidecar must be told the same B
(``--max-running``) and how many more requests to keep queued inside vLLM
(``--engine-queue``), or it keeps the batch half empty or overfills it. One pure function,
:func:`batch_shape`, derives all three from the vLLM arguments (a user-set
``--max-num-seqs`` wins, else a default); the operator's pod template and ``jitserve up``
both call it, so the two stacks cannot drift apart. :func:`parallel_args` does the same
for tensor parallelism: it follows the pod's GPU count unless the user's own
``--tensor-parallel-size`` (times ``--pipeline-parallel-size``) already matches it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

# vLLM's own default for the OpenAI server on most GPUs; it picks more on large ones
# (1024 on 80 GB cards), so the operator always passes B rather than guess vLLM's choice.
GPU_MAX_NUM_SEQS = 256
MAX_NUM_SEQS = "--max-num-seqs"
TENSOR_PARALLEL = "--tensor-parallel-size"
PIPELINE_PARALLEL = "--pipeline-parallel-size"


class ArgsError(ValueError):
    """A vLLM argument the pod's shape depends on is malformed or contradicts the spec."""


def flag_value(args: Sequence[str], flag: str) -> str | None:
    """The value of ``flag`` in ``args`` (``--flag V`` or ``--flag=V``; the last one wins,
    as argparse does), or None."""
    found: str | None = None
    for i, arg in enumerate(args):
        if arg == flag:
            if i + 1 >= len(args):
                raise ArgsError(f"{flag} needs a value")
            found = args[i + 1]
        elif arg.startswith(flag + "="):
            found = arg.split("=", 1)[1]
    return found


def _positive(args: Sequence[str], flag: str) -> int | None:
    text = flag_value(args, flag)
    if text is None:
        return None
    try:
        value = int(text)
    except ValueError:
        raise ArgsError(f"{flag} {text!r}: not an integer") from None
    if value < 1:
        raise ArgsError(f"{flag} {value}: must be at least 1")
    return value


def default_engine_queue(max_running: int) -> int:
    """Requests queued inside vLLM beyond its B slots when none is set: B/2, at least 2
    (enough that a slot freed mid-step is refilled in vLLM's next step)."""
    return max(max_running // 2, 2)


@dataclass(frozen=True)
class BatchShape:
    """B and the engine queue, and the flags that carry them."""

    max_num_seqs: int
    engine_queue: int

    def vllm_args(self, args: Sequence[str]) -> list[str]:
        """``args`` with ``--max-num-seqs B`` (unchanged where the user set it)."""
        if flag_value(args, MAX_NUM_SEQS) is not None:
            return list(args)
        return [*args, MAX_NUM_SEQS, str(self.max_num_seqs)]

    def sidecar_args(self) -> list[str]:
        return ["--max-running", str(self.max_num_seqs), "--engine-queue", str(self.engine_queue)]


def batch_shape(
    vllm_args: Sequence[str], *, default_max_num_seqs: int, engine_queue: int | None = None
) -> BatchShape:
    """B from the user's ``--max-num-seqs`` in ``vllm_args``, else ``default_max_num_seqs``;
    the engine queue as given, else :func:`default_engine_queue` of B."""
    given = _positive(vllm_args, MAX_NUM_SEQS)
    b = given if given is not None else default_max_num_seqs
    if b < 1:
        raise ArgsError(f"{MAX_NUM_SEQS} {b}: must be at least 1")
    if engine_queue is not None and engine_queue < 0:
        raise ArgsError(f"engine queue {engine_queue}: must be at least 0")
    return BatchShape(b, default_engine_queue(b) if engine_queue is None else engine_queue)


def parallel_args(vllm_args: Sequence[str], gpus: int) -> list[str]:
    """The flags to add so vLLM spreads the model over the pod's ``gpus``: none on a CPU
    pod or one GPU, ``--tensor-parallel-size gpus`` otherwise, and none where the user's
    own sizes already cover the GPUs. Raises :class:`ArgsError` when they do not."""
    tp = _positive(vllm_args, TENSOR_PARALLEL)
    pp = _positive(vllm_args, PIPELINE_PARALLEL) or 1
    if tp is None:
        if gpus % pp:
            raise ArgsError(f"{PIPELINE_PARALLEL} {pp} does not divide the pod's {gpus} GPUs")
        size = max(gpus // pp, 1)
        return [TENSOR_PARALLEL, str(size)] if size > 1 else []
    if gpus > 0 and tp * pp != gpus:
        raise ArgsError(
            f"{TENSOR_PARALLEL} {tp} x {PIPELINE_PARALLEL} {pp} = {tp * pp} GPUs, but the pod "
            f"has {gpus} (model.gpus): drop {TENSOR_PARALLEL} (it follows model.gpus) or make "
            "them agree"
        )
    return []
