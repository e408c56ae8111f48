"""Choosing endpoints: profile handlers, filters, weighted scorers and pickers."""
