import sys

from mpi_trainer.cli import main

sys.exit(main())
