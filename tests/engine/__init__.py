"""Tests of jitserve.engine (the in-engine scheduler loaded into vLLM)."""
