"""Log line formats: text (the default) or JSON, one object per line, with the current trace's ids."""

from __future__ import annotations

import datetime as dt
import json
import logging

from ragsidecar import tracing

FORMATS = ("text", "json")
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s %(message)s"


class JsonFormatter(logging.Formatter):
    """{"time", "level", "logger", "message"[, "exception"][, "trace_id", "span_id"]} per record.

    The ids are those of the span current where the line was logged (a call's RPC span or one of its stages),
    in the W3C hex form a tracing backend searches by; absent when tracing is off or no span is current."""

    def format(self, record: logging.LogRecord) -> str:
        line = {
            "time": dt.datetime.fromtimestamp(record.created, dt.UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        ids = tracing.log_ids()
        if ids:
            line["trace_id"], line["span_id"] = ids
        return json.dumps(line, ensure_ascii=False)


def configure(level: str, format_name: str) -> None:
    """Logging to stderr in the named format."""
    handler = logging.StreamHandler()
    handler.setFormatter(JsonFormatter() if format_name == "json" else logging.Formatter(TEXT_FORMAT))
    logging.basicConfig(level=level.upper(), handlers=[handler])
