"""atheris target: the torch.export .pt2 reader (`make fuzz`, or `python fuzz/fuzz_torch_export.py -help=1`)."""

from __future__ import annotations

from harness import main, reader_target

if __name__ == "__main__":
    main(reader_target("torch-export"))
