"""Hugging Face Hub gate: remote scans, gated uploads, a webhook reviewer.

Feeds Hub files into the same readers, inventory and rules as a local scan
(``scan``, ``remote``), and answers on the Hub (``comment``, ``upload``,
``answer``).  ``fix`` proposes fixes as one pull request: ``access`` (may the
token open it), ``mirror`` (the files the fixes read, and the revision with the
fixed files in place), ``proposal`` (its marker, opened exactly once),
``fix_result`` and ``fix_text`` (the record and its views).  ``client`` is the
one door to the Hub (rate limits and retries from ``retry``, errors from
``errors``).  The reviewer service is ``webhook``
(the app), ``reviewer`` (workers), ``queue`` (durable jobs: SQLite or
PostgreSQL), ``metrics``, ``logs`` and ``service`` (the process);
``faults`` is the kill-test hook.  huggingface_hub, the ASGI server and psycopg
are imported inside the functions (the `hub` and `postgres` extras).  The
command wiring lives in ``guard.cli.hub``; nothing here imports the CLI.
"""
