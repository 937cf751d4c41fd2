"""Tests of jitserve.devstack."""
