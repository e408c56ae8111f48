"""Prefix-cache helpers shared by the prefix producers: block hashing and the approximate index."""
