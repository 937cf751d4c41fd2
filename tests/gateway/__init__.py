"""Tests of jitserve.gateway."""
