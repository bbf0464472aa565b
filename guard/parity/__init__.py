"""The parity smoke test: seeded inputs through transformers' paired PyTorch and Flax classes.

``run`` orchestrates (``run_parity``), ``inputs`` builds the seeded inputs, ``stream_torch`` and
``stream_flax`` run each side block by block from ``weights`` (a checkpoint read a tensor at a
time), ``runs`` loads and calls a whole model where streaming cannot, ``metrics`` compares two
outputs and holds the fp32 bound, ``relative`` judges a bf16/fp16 model against PyTorch's own
error, ``located`` finds the first block that disagrees, ``verdict`` plans the comparisons and
words the CG302 findings.  ``needs`` finds where the Flax side runs: here under transformers 4.x,
else in a transformers-4 environment through the worker (``legacy_flax``, ``guard.worker.flax_side``)
while the PyTorch side runs here on transformers 5.  Needs the `parity` extra, imported inside the
functions; may import the inventory, catalogue, findings, convert's readers
(``guard.convert.read.source``) and ``guard.convert.map.families`` (which twins pair, which
families compute tables), never the CLI.
"""
