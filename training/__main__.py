"""`python -m training ...`: see training/cli.py."""

import os

# Set before torch loads OpenMP: idle worker threads then sleep instead of spinning. On a CPU shared with
# other jobs, spinning threads take the cores the working ones need (steps measured 8x slower with 2).
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from training.cli import main  # after the environment is set

if __name__ == "__main__":
    main()
