"""`python -m maitred`: the same as the `maitred` command."""

from maitred.cli import main

if __name__ == "__main__":
    main()
