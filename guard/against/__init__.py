"""``parity SRC --against STACK``: does that JAX stack load this Hugging Face checkpoint right?

The stacks are rows of the one table of targets (``guard.targets.table``: library and version through the
environment, loads, the name/tree mapping as data, citing the library's conversion code); ``targets`` is
the view of the rows ``--against`` checks.  ``tree`` compares every parameter the library holds with the
file, bit for bit after the mapping's steps (``guard.convert.steps``); ``run`` drives the library through
the worker protocol (``guard.worker``) and judges its forward against PyTorch's as ``parity`` judges
(``guard.parity.verdict``).  MaxText reads no HF file: ``maxtext_tree`` converts first and takes its
mapping from the converter's table.  ``easydel_causes`` and ``maxtext_causes`` name what a stack's forward
is known to do differently (the causes on a row, matched by ``causes``).  May import guard.parity, guard.worker,
guard.convert, guard.targets, the inventory and catalogue; never the CLI.
"""
