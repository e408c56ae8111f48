"""``python -m epp``: the same as the ``epp`` console script."""

from epp.cli.main import main

if __name__ == "__main__":
    main()
