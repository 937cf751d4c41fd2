"""Tests of jitserve.bench."""
