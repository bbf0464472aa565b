"""atheris target: the HDF5 reader as a scan runs it, h5py in its worker process.

libhdf5 can spin on hostile bytes (tests/data/hdf5/vlen-attribute-spins.h5), so the
walk never runs in the fuzzed process: a spin there is CG001 after
``hdf5_worker.STALL_SECONDS``, a crash CG001 at once; what escapes is ours.
"""

from __future__ import annotations

from harness import main, reader_target

if __name__ == "__main__":
    main(reader_target("hdf5"))
