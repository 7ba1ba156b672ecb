"""``python -m specwatch`` runs the ``specwatch`` console script."""

from specwatch.cli import main

if __name__ == "__main__":
    main()
