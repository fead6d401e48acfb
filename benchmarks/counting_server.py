"""``ace3 server``'s app under uvicorn, counting the SQL statements this process executes.

For the server benchmarks only: every statement SQLAlchemy sends (any engine of the process)
adds one to a counter that a thread writes to ``$ACE3_BENCH_QUERY_COUNT_FILE.<pid>`` every
0.2 s. ``--workers N`` runs N such processes on one port (uvicorn's workers).
"""

from __future__ import annotations

import argparse
import os
import threading
import time
from pathlib import Path
from typing import Any

import uvicorn
from sqlalchemy import event
from sqlalchemy.engine import Engine

_count = 0


def _counted(*_args: Any, **_kwargs: Any) -> None:
    global _count
    _count += 1


def _write_count(path: Path) -> None:
    while True:
        path.write_text(str(_count))
        time.sleep(0.2)


def app() -> Any:
    """The app (a factory, so that each uvicorn worker counts its own statements)."""
    from ace3_control.settings import get_settings
    from ace3_server.app import create_app

    event.listen(Engine, "before_cursor_execute", _counted)
    target = Path(os.environ["ACE3_BENCH_QUERY_COUNT_FILE"] + f".{os.getpid()}")
    threading.Thread(target=_write_count, args=(target,), daemon=True).start()
    return create_app(get_settings())


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--workers", type=int, default=1)
    args = parser.parse_args()
    uvicorn.run(
        "counting_server:app",
        factory=True,
        host="127.0.0.1",
        port=args.port,
        workers=args.workers,
        log_level="warning",
        app_dir=str(Path(__file__).resolve().parent),
    )


if __name__ == "__main__":
    main()
