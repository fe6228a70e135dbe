"""How late a thread wakes from 1 ms sleeps, and the VM's steal time, once a second.

    .venv/bin/python hiccup.py SECONDS OUT            # default policy (SCHED_OTHER)
    chrt -f 50 .venv/bin/python hiccup.py SECONDS OUT # real-time

Writes "<unix time> late <ms>" for every wake-up more than 5 ms late and
"<unix time> steal <jiffies>" each second (the steal column of /proc/stat).
"""

import sys
import time


def steal() -> int:
    with open("/proc/stat") as stat:
        return int(stat.readline().split()[8])


def main() -> None:
    seconds, path = float(sys.argv[1]), sys.argv[2]
    end = time.time() + seconds
    last_steal, last = steal(), time.time()
    with open(path, "w") as out:
        while time.time() < end:
            start = time.perf_counter()
            time.sleep(0.001)
            late = (time.perf_counter() - start - 0.001) * 1000
            now = time.time()
            if late > 5:
                out.write(f"{now:.3f} late {late:.1f}\n")
            if now - last >= 1:
                current = steal()
                out.write(f"{now:.3f} steal {current - last_steal}\n")
                last_steal, last = current, now


if __name__ == "__main__":
    main()
