"""Foreign CPU share beside a running perf/overload_run.py, sampled every 30 s.

Why: the overload driver does not sample the machine's quiet itself; this watcher, run
beside it, counts the CPU of every process outside the driver's tree (itself included)
as foreign, per 30 s window, until the driver exits. One JSON line per window.

    .venv/bin/python noise.py <driver pid> > noise.jsonl
"""

from __future__ import annotations

import json
import os
import sys
import time

import psutil

from tritonforge.bench.noise import busiest_foreign, foreign_share, snapshot

WINDOW_S = 30.0


def main() -> None:
    driver = psutil.Process(int(sys.argv[1]))
    before = snapshot(driver)
    while driver.is_running():
        time.sleep(WINDOW_S)
        try:
            after = snapshot(driver)
        except psutil.Error:
            break
        row = {
            "utc": time.strftime("%H:%M:%S", time.gmtime()),
            "load_1m": os.getloadavg()[0],
            "foreign_cpu_share": round(foreign_share(before, after), 4),
            "foreign_top": busiest_foreign(before, after),
        }
        print(json.dumps(row), flush=True)
        before = after


if __name__ == "__main__":
    main()
