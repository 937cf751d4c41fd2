"""Tests of jitserve.operator."""
