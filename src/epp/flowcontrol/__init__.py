"""Admission by queueing: priority bands, fairness and ordering policies, saturation detectors."""
