"""What the benchmarks record beside their numbers, and how they write them.

Each script writes `<stem>.json` (the metadata and the raw results) and
`<stem>.md` (the table that the docs quote) into one results directory.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import pathlib
import platform
import sys


def arguments(doc: str | None, results: pathlib.Path) -> argparse.Namespace:
    """The options of a benchmark that has a quick mode: ``--quick``, ``--rounds`` (None:
    the script's default) and ``--out`` (default `results`), with `doc` as its help."""
    parser = argparse.ArgumentParser(
        description=doc, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--rounds", type=int, default=None)
    parser.add_argument("--out", default=str(results))
    return parser.parse_args()


def run_meta(**extra) -> dict:
    """When, where and with which Python and JAX a run was made, plus `extra`."""
    import jax  # here: run.py writes with this module but runs JAX only in its workers

    return dict(
        date=datetime.datetime.now().isoformat(timespec="seconds"),
        machine=f"{platform.machine()} {os.cpu_count()} cores",
        python=sys.version.split()[0],
        jax=jax.__version__,
        **extra,
    )


def run_line(meta: dict) -> str:
    """The opening of a results table's caption: "Run <date> on <machine>: Python .., jax .."."""
    return f"Run {meta['date']} on {meta['machine']}: Python {meta['python']}, jax {meta['jax']}"


def save(out_dir, stem: str, payload: dict, text: str) -> None:
    """Write `payload` to <out_dir>/<stem>.json and `text` to <out_dir>/<stem>.md."""
    out = pathlib.Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{stem}.json").write_text(json.dumps(payload, indent=1))
    (out / f"{stem}.md").write_text(text)
