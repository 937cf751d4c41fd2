"""Measured engine speed: the figures a policy plans with (``EngineView``).

Both engines feed the same meter with the same rules: the simulator with every
iteration it models, the sidecar with what it observes of vLLM (the median gap between
tokens over a frame; the time from dispatch to the first token of a segment). The
smoothing constants are those the simulator has used since its first figures.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True)
class SpeedMeter:
    decode_step_s: float
    """One decode step at the current load (v_token)."""
    prefill_s_per_token: float
    """Wall time per prompt token of an iteration that prefills."""
    token_s: float
    """Engine seconds per batched token (iteration time / tokens in it)."""

    def decode_stretch(self, seconds: float, steps: int, decoders: int) -> None:
        """``steps`` decode-only iterations of ``decoders`` sequences took ``seconds``."""
        if steps <= 0 or decoders <= 0:
            return
        self.decode_step_s += 0.3 * (seconds / steps - self.decode_step_s)
        self.token_s += 0.05 * (seconds / (steps * decoders) - self.token_s)

    def prefill_iteration(self, seconds: float, prefill_tokens: int, decoders: int) -> None:
        """One iteration computed ``prefill_tokens`` of prompt beside ``decoders``
        decoding sequences in ``seconds``."""
        if prefill_tokens <= 0:
            return
        self.token_s += 0.05 * (seconds / (prefill_tokens + decoders) - self.token_s)
        self.prefill_s_per_token += 0.05 * (seconds / prefill_tokens - self.prefill_s_per_token)
        if decoders:
            self.decode_step_s += 0.1 * (seconds - self.decode_step_s)
