"""Everything that speaks MPI (this is the only package that imports mpi4py).

Under Open MPI's fault-tolerant MPI (``--with-ft ulfm``, which sets ``OMPI_MCA_mpi_ft_enable``)
the ranks that survive a lost peer skip the runtime's fence at the start of ``MPI_Finalize``:
across hosts that fence waits for the dead ranks and never returns (a known Open MPI defect,
open-mpi/ompi#11404). The job's own closing barrier runs on the shrunk communicator before it,
so nothing is left in flight. It must be set before MPI starts, hence here.
"""

import os

if os.environ.get("OMPI_MCA_mpi_ft_enable", "").lower() in ("1", "true", "yes"):
    os.environ.setdefault("OMPI_MCA_async_mpi_finalize", "1")
