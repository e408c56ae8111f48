"""`python -m epp_sim` runs the `epp-sim` command."""

from __future__ import annotations

from epp_sim.cli import main

if __name__ == "__main__":
    main()
