"""Training-state sets: the checkpoints distributed trainers write, read as what they are.

A training checkpoint (PyTorch DCP, DeepSpeed ZeRO, Megatron ``torch_dist``, ...) is a directory of
shards, partitions and metadata.  Each is read, headers only and without executing a pickle, into one
``guard.training.state.TrainingState``: the trainer and format, the world size and sharding, the
model's *logical* tensors (global shapes, the dtype it would publish), where each dtype lives (module
weights, master weights, optimizer moments) and the non-tensor items by name.  The scan sees it as one
``FileScan`` (``training_scan``) whose tensors are the logical weights and whose ``training`` field is
the record; the inventory makes it one set of role ``training-state`` with the record's ``layout``
(the dtype rules judge those tensors, never the moments: see ``WeightSet.judged``).

How a new trainer plugs in (no other module changes):
1. A module ``guard/training/<layout>/dirs.py`` with
   ``claim(directory: str, names: frozenset[str]) -> TrainingDir | None`` (names only, no I/O beyond
   what the claim must see) and ``scan(found: TrainingDir, *, name: str) -> FileScan`` that reads the
   directory and returns ``training_scan(state, ...)``; every problem is a finding naming its file.  A
   pickle it walks goes through ``guard.training.pickles.AllowListWalker`` with the row's ``PickleGlobals``.
2. One row in ``guard.training.registry.TRAINERS``: its marker names (discovery imports this package's
   readers only when one of them is seen), ``claim`` and ``scan``, the globals its pickles may hold, and,
   for ``convert``, its ``source`` (``find_checkpoint`` and ``open_checkpoint``, in
   ``guard/convert/training/``) and the adapters that give its names as HF's.
3. Tests that write the layout with the trainer itself (``tests/test_training_<layout>.py``).

``registry`` holds the table, ``pickles`` the one allow-list walker, ``state`` the records and the shared
helpers (container prefixes, the FileScan), ``dirs`` discovery's entry point, ``published`` CG122 (a
published copy narrower than the masters); ``dcp/`` reads PyTorch Distributed Checkpoint, ``deepspeed/``
ZeRO's partitions, ``megatron/`` Megatron-core's save folder and ``common.pt``.  May import the records,
tensors, sources, findings, catalogue and readers; never the inventory, write, convert, rules, report or CLI
(``tests/test_architecture.py``): what builds a model to write from a checkpoint is ``guard.convert.training``.
"""
