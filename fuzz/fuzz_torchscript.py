"""atheris target: TorchScript archives (`make fuzz`, or `python fuzz/fuzz_torchscript.py -help=1`).

Seeds are torch.jit archives (fuzz/corpus/torchscript/): a zip with constants.pkl is read by
guard.readers.torch.torchscript, which the torch-zip reader dispatches to.
"""

from __future__ import annotations

from harness import main, reader_target

if __name__ == "__main__":
    main(reader_target("torch-zip"))
