"""The child side of the protocol for running a library in an environment of its own.

``python -m guard.worker`` reads one JSON request on stdin and writes one JSON answer on stdout
(``guard.envs.protocol``).  It needs only the target's environment and this package on PYTHONPATH: no
click, no torch unless the library itself imports it.  Each target's library code is one side module,
named by its row in ``guard.targets.table`` and implementing ``side.Side``; ``loads`` runs a row's loads
for the sides that load a checkpoint.  The parent side is ``guard.envs.worker``.  Never imports
guard.against or guard.cli.
"""
