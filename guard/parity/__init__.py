"""The parity smoke test: seeded inputs through transformers' paired PyTorch and Flax classes.

``run`` orchestrates (``run_parity``), ``inputs`` builds the seeded inputs, ``runs`` loads
and calls one side at a time, ``metrics`` compares two outputs and holds the fp32 bound,
``relative`` judges a bf16/fp16 model against PyTorch's own error, ``verdict`` plans the
comparisons and words the CG302 findings.  Needs the
`parity` extra (torch, jax, flax, transformers 4.x), imported inside the functions; may import
the inventory, catalogue, findings and ``guard.convert.map.families`` (which twins pair, which
families compute tables), never the CLI.
"""
