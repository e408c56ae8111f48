"""Prefix-cache helpers shared by the prefix producers: block hashing, the approximate index, and
the joint placement of a burst window (burst-prefix-cache-producer)."""
