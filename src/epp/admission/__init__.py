"""Admission: legacy saturation shedding or flow control."""
