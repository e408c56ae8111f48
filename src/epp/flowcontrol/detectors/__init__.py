"""Built-in saturation detectors; each is also a scheduling filter."""
