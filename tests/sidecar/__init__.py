"""Tests of jitserve.sidecar."""
