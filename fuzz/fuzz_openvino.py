"""atheris target: the openvino reader (`make fuzz`, or `python fuzz/fuzz_openvino.py -help=1`)."""

from __future__ import annotations

from harness import main, reader_target

if __name__ == "__main__":
    main(reader_target("openvino"))
