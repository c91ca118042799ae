"""Everything that speaks MPI (this is the only package that imports mpi4py)."""
