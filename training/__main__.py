"""`python -m training ...`: see training/cli.py."""

from training.cli import main

if __name__ == "__main__":
    main()
