"""``llog loadtest``: ``main(argv) -> exit code``.

    llog loadtest up        --scenario smoke            # prepare run dir, start the stack
    llog loadtest status    [--scenario smoke | --run-dir DIR] [--json]
    llog loadtest precreate [--scenario smoke | --run-dir DIR]
    llog loadtest run       --scenario smoke [--run-dir DIR] [--keep] [--set k=v ...]
    llog loadtest down      [--scenario smoke | --run-dir DIR]
    llog loadtest verify    [--run-dir DIR] [--broker URL]   # read acked records back
    llog loadtest report    [--run-dir DIR]                  # rebuild summary + report
    llog loadtest list                                       # runs under results/

Without ``--run-dir``, status/precreate/down use the newest run of ``--scenario`` (or the
newest run at all). Also ``python -m app.loadtest.cli ...``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from app.loadtest import rundir
from app.loadtest.hammer import HammerError
from app.loadtest.orchestrator import (
    LoadTestError,
    down,
    finish,
    precreate_run,
    run_scenario,
    stack_up,
    status,
    up,
)
from app.loadtest.rundir import DEFAULT_RESULTS, RunDir, latest_run_dir, read_json
from app.loadtest.scenario import (
    Scenario,
    ScenarioError,
    from_resolved,
    load_scenario,
    parse_override,
)
from app.loadtest.summary import headline_table
from app.loadtest.verify import verify_acked
from app.localstack.binaries import BuildError
from app.localstack.processes import ProcessFailed


def _scenario(args: argparse.Namespace) -> Scenario | None:
    if not getattr(args, "scenario", None):
        return None
    overrides = dict(parse_override(s) for s in getattr(args, "set", None) or [])
    return load_scenario(args.scenario, overrides)


def _run_dir(args: argparse.Namespace) -> RunDir:
    if getattr(args, "run_dir", None):
        run = RunDir(Path(args.run_dir).resolve())
        if not run.exists():
            raise LoadTestError(f"{run.path} is not a load-test run directory")
        return run
    name = None
    if getattr(args, "scenario", None):
        scenario = _scenario(args)
        assert scenario is not None
        name = scenario.name
    found = latest_run_dir(Path(args.results), name)
    if found is None:
        raise LoadTestError(f"no run{' of ' + name if name else ''} under {args.results}")
    return found


def cmd_up(args: argparse.Namespace) -> int:
    scenario = _scenario(args)
    if scenario is None:
        raise LoadTestError("up needs --scenario")
    run = up(scenario, Path(args.results))
    print(run.path)
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    run = _run_dir(args)
    info = status(run)
    if args.json:
        print(json.dumps(info, indent=2))
        return 0 if info["stack_up"] else 3
    print(f"{info['run_id']}: {info['status']}" + (f" ({info['error']})" if info["error"]
                                                     else ""))
    print(f"  run dir  {info['run_dir']}")
    print(f"  oxia     {info['oxia']}   s3 {info['s3']}")
    for name, proc in info["processes"].items():
        print(f"  {name:<10} pid {proc['pid']}  {'alive' if proc['alive'] else 'gone'}")
    for b in info["brokers"]:
        state = "healthy" if b["healthy"] else ("alive" if b["alive"] else "gone")
        print(f"  broker {b['id']:<4} {b['url']}  pid {b['pid']}  {state}")
    return 0 if info["stack_up"] else 3


def cmd_precreate(args: argparse.Namespace) -> int:
    precreate_run(_run_dir(args))
    return 0


def cmd_run(args: argparse.Namespace) -> int:
    scenario = _scenario(args)
    run_dir = RunDir(Path(args.run_dir).resolve()) if args.run_dir else None
    if scenario is None and run_dir is None:
        raise LoadTestError("run needs --scenario or --run-dir")
    run, summary = run_scenario(scenario, run_dir=run_dir, results=Path(args.results),
                                keep=True if args.keep else None)
    _print_summary(run, summary)
    return 0 if summary.get("hammer_exit_code") == 0 else 1


def _print_summary(run: RunDir, summary: dict[str, Any]) -> None:
    print(headline_table([summary["headline"]]))
    for warning in summary.get("warnings", []):
        print(f"warning: {warning}")
    print(f"summary: {run / rundir.SUMMARY}")
    print(f"report:  {run / rundir.REPORT}")


def cmd_down(args: argparse.Namespace) -> int:
    run = _run_dir(args)
    result = down(run)
    print(f"{run.run_id}: stopped {', '.join(result['stopped']) or 'nothing (already down)'}")
    if result["still_running"]:
        print(f"still running: {', '.join(result['still_running'])}", file=sys.stderr)
        return 1
    return 0


def cmd_verify(args: argparse.Namespace) -> int:
    run = _run_dir(args)
    url = args.broker
    if url is None:
        if not stack_up(run):
            raise LoadTestError("the run's stack is down; pass --broker URL")
        url = next(b["url"] for b in run.stack()["brokers"] if "read" in b["roles"])
    result = verify_acked(run / rundir.ACKED, url)
    rundir.write_json(run / rundir.VERIFY, result)
    print(json.dumps({k: v for k, v in result.items() if k != "examples"}, indent=2))
    return 0 if result["ok"] else 1


def cmd_report(args: argparse.Namespace) -> int:
    run = _run_dir(args)
    previous: dict[str, Any] = {}
    if (run / rundir.SUMMARY).is_file():
        previous = read_json(run / rundir.SUMMARY)
    extra: dict[str, Any] = {k: previous[k] for k in ("hammer_exit_code", "hammer_binary", "verify")
             if k in previous}
    summary = finish(run, from_resolved(run.resolved()), extra)
    _print_summary(run, summary)
    return 0


def cmd_list(args: argparse.Namespace) -> int:
    results = Path(args.results)
    for child in sorted(results.iterdir()) if results.is_dir() else []:
        run = RunDir(child)
        if run.exists():
            print(f"{run.run_id}  {run.stack().get('status')}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="llog loadtest",
                                     description="load tests against a local Oxia+MinIO stack")
    sub = parser.add_subparsers(dest="command", required=True)

    def add(name: str, func: Any, help_text: str, *, scenario: bool = True,
            run_dir: bool = True) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help_text)
        p.add_argument("--results", default=str(DEFAULT_RESULTS),
                       help="results directory (default: results/ in the repository)")
        if scenario:
            p.add_argument("--scenario", help="scenario file, or a name in "
                                              "deploy/loadtest/scenarios (smoke, ...)")
            p.add_argument("--set", action="append", metavar="KEY=VALUE",
                           help="override a scenario value, e.g. workload.duration_s=10")
        if run_dir:
            p.add_argument("--run-dir", help="a run directory (default: the newest run)")
        p.set_defaults(func=func)
        return p

    add("up", cmd_up, "prepare a run directory and start the stack", run_dir=False)
    add("status", cmd_status, "show a run's processes").add_argument(
        "--json", action="store_true")
    add("precreate", cmd_precreate, "create the scenario's partitions")
    add("run", cmd_run, "run the scenario (bringing a stack up if needed)").add_argument(
        "--keep", action="store_true", help="leave the stack running afterwards")
    add("down", cmd_down, "stop a run's processes")
    add("verify", cmd_verify, "read acknowledged records back",
        scenario=True).add_argument("--broker", help="broker URL to read through")
    add("report", cmd_report, "rebuild summary.json and report.html from the artifacts")
    add("list", cmd_list, "list runs", scenario=False, run_dir=False)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args))
    except (LoadTestError, ScenarioError, HammerError, BuildError, ProcessFailed) as exc:
        print(f"llog loadtest: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
