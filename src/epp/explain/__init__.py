"""Explaining routing decisions: what each filter kept, what each scorer gave, what was picked.

``record`` holds the decision record, the bounded ring behind ``/debug/decisions`` and the
wire formats of the per-scorer breakdown (used by the director and the ext_proc edge);
``table`` renders a decision as a table; ``offline`` replays a request through the real
pipeline without a network (``epp explain``).  See docs/explain.md.
"""
