"""atheris target: the .keras reader (zip directory, JSON members, policy; h5 member via the worker)."""

from __future__ import annotations

from harness import main, reader_target

if __name__ == "__main__":
    main(reader_target("keras"))
