"""Tests of jitserve.scheduling."""
