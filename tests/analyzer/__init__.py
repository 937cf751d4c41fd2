"""Tests of jitserve.analyzer."""
