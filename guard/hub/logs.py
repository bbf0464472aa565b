"""The service's log: plain lines, or JSON lines (``--log-format json``) for a log pipeline.

One ``logging.config`` dictionary covers ckpt-guard's loggers and uvicorn's,
so the access log and the review log come out in the same format.  Fields
passed through ``extra=`` (repo, ref, sha, job, seconds...) become JSON keys.
"""

from __future__ import annotations

import json
import logging
import logging.config
import sys
from datetime import datetime, timezone
from typing import Any

FORMATS = ("text", "json")
# Attributes every LogRecord has; anything else came through ``extra=``.
_STANDARD = set(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {"message", "asctime", "color_message"}


class StderrHandler(logging.StreamHandler):
    """Writes to whatever ``sys.stderr`` is at each record, never to a stream that was replaced."""

    def __init__(self) -> None:
        super().__init__()

    @property
    def stream(self) -> Any:
        return sys.stderr

    @stream.setter
    def stream(self, value: Any) -> None:
        pass


class JsonLines(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, timezone.utc).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(), "logger": record.name, "message": record.getMessage(),
        }
        entry.update((k, v) for k, v in vars(record).items() if k not in _STANDARD and not k.startswith("_"))
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str, ensure_ascii=False)


def log_config(fmt: str, *, level: str = "INFO") -> dict[str, Any]:
    """A dictConfig for ckpt-guard's and uvicorn's loggers, on stderr."""
    if fmt not in FORMATS:
        raise ValueError(fmt)
    formatter: dict[str, Any] = ({"()": JsonLines} if fmt == "json" else
                                 {"format": "%(asctime)s %(levelname)s %(name)s: %(message)s"})
    handler = {"()": StderrHandler, "formatter": "main"}
    loggers = {name: {"handlers": ["main"], "level": level, "propagate": False}
               for name in ("ckpt-guard", "uvicorn", "uvicorn.error", "uvicorn.access")}
    return {"version": 1, "disable_existing_loggers": False, "formatters": {"main": formatter},
            "handlers": {"main": handler}, "loggers": loggers}


def configure(fmt: str) -> dict[str, Any]:
    config = log_config(fmt)
    logging.config.dictConfig(config)
    return config
