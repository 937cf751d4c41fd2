"""Tests of jitserve.sim."""
