"""Tests of the reporter plugins."""
