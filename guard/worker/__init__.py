"""One small protocol for running a library in an environment of its own.

``python -m guard.worker`` reads one JSON request on stdin and writes one JSON answer on stdout
(``protocol``).  It needs only the target's environment and this package on PYTHONPATH: no click,
no torch unless the library itself imports it.  The library's code lives in one module per target
(``SIDES``); the parent side is ``client``.
"""
