"""``parity SRC --against STACK``: does that JAX stack load this Hugging Face checkpoint right?

``targets`` is the table (one row per stack: library, version, environment, loads, the name/tree
mapping as data, citing the library's conversion code); ``tree`` compares every parameter the
library holds with the file, bit for bit after the mapping's transpose/reshape; ``run`` drives
the library through the worker protocol (``guard.worker``) and judges its forward against
PyTorch's as ``parity`` judges (``guard.parity.verdict``).  MaxText reads no HF file: ``maxtext_tree``
converts first and takes its mapping from the converter's table.  ``easydel_causes`` names what
EasyDeL's forward is known to do differently (a target's ``forward_causes``).  May import guard.parity,
guard.worker, guard.convert.maxtext, the inventory and catalogue; never the CLI.
"""
