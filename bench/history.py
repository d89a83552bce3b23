"""A history run of any length: clients record every operation while the nemesis injects
faults, then the checker reads the whole history (tests/history/, docs/testing.md).

    .venv/bin/python bench/history.py --minutes 30 --seed 7 [--oxia-cluster] [--out DIR]
    .venv/bin/python bench/history.py --check DIR     # the checker again, on a saved run

Prints the report's counts and verdict and exits 1 on any anomaly; the history, the
report and its plot are in ``--out`` (default ``.llog/history/seed-S``).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.history.nemesis import FAULTS  # noqa: E402
from tests.history.run import recheck, run  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=2.0)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--extra-producers", type=int, default=0,
                        help="more producers with idempotency keys (a denser key window)")
    parser.add_argument("--client-timeout-s", type=float, default=30.0,
                        help="every client's timeout (producers ask for it less 1 s as "
                             "their commit deadline)")
    parser.add_argument("--slow-s", default="0.5,8",
                        help="how long a slow store holds each answer: LOW,HIGH seconds")
    parser.add_argument("--oxia-cluster", action="store_true",
                        help="Oxia as three data servers (replication factor 3), each "
                             "behind a fault proxy: adds the *_oxia link faults")
    parser.add_argument("--broker-code", type=Path, default=None, metavar="DIR",
                        help="run the brokers of this checkout (a worktree of an older "
                             "commit); the clients, nemesis and checker stay these")
    parser.add_argument("--faults", default=",".join(FAULTS),
                        help=f"comma-separated, of {', '.join(FAULTS)}")
    parser.add_argument("--check", type=Path, default=None, metavar="DIR",
                        help="run nothing: check the history saved in DIR again and write "
                             "its report (a new checker, or a report lost)")
    args = parser.parse_args()
    if args.check is not None:
        report = recheck(args.check, seed=args.seed)
        print(json.dumps(report.summary(), indent=1))
        sys.exit(0 if report.valid else 1)
    out = args.out or ROOT / ".llog" / "history" / f"seed-{args.seed}"
    faults = tuple(f for f in args.faults.split(",") if f)
    low, high = (float(x) for x in args.slow_s.split(","))
    report = run(out, seconds=args.minutes * 60, seed=args.seed, faults=faults,
                 extra_producers=args.extra_producers, slow_s=(low, high),
                 client_timeout_s=args.client_timeout_s, oxia_cluster=args.oxia_cluster,
                 broker_code=args.broker_code)
    print(json.dumps(report.summary(), indent=1))
    print(f"history, report.json and report.html in {out}")
    sys.exit(0 if report.valid else 1)


if __name__ == "__main__":
    main()
