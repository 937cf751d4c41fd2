"""Values the analyzer's service and its client agree on over gRPC (a leaf module: the
client imports it without the analyzer's heavy dependencies)."""

from __future__ import annotations

NO_TOOL = "none"
"""Tool name of a stage whose tool call is not known (yet)."""
