#!/usr/bin/env python3
"""Run hardbyte/postgresql-job-queue-benchmarking's orchestrator without Docker.

`run-native` calls this with the harness checkout, the private Postgres it started and the
adapters to register; everything after `--` goes to the harness's own CLI (`bench run ...`).
What it changes in the harness, in memory only (the checkout is not edited):

- the Postgres lifecycle: no `docker compose`; the server `run-native` started is used for
  every system (the harness's `--fast` path: one server, the database recreated per system),
  and the chaos hooks' stop/start call `pg_ctl` on it;
- the port, user and password the harness builds its URLs from;
- where results go (`--results DIR`);
- the adapters: `stagedoor` (the binary built from `stagedoor-bench/`), and `pgboss` run with
  the host's `node` instead of its Docker image.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--harness", required=True, type=Path)
    p.add_argument("--port", required=True, type=int)
    p.add_argument("--pgdata", required=True)
    p.add_argument("--pg-bin", required=True)
    p.add_argument("--pg-log", required=True)
    p.add_argument("--results", required=True, type=Path)
    p.add_argument("--stagedoor-bin", required=True)
    p.add_argument("--as-postgres", action="store_true", help="run pg_ctl through runuser -u postgres")
    p.add_argument("rest", nargs=argparse.REMAINDER)
    a = p.parse_args()
    rest = a.rest[1:] if a.rest[:1] == ["--"] else a.rest

    sys.path.insert(0, str(a.harness.resolve()))
    import psycopg  # noqa: E402
    from bench_harness import adapters as ad  # noqa: E402
    from bench_harness import orchestrator as orch  # noqa: E402

    ad.PG_PORT = a.port
    ad.PG_USER = "bench"
    ad.PG_PASS = "bench"
    orch.RESULTS_ROOT = a.results
    a.results.mkdir(parents=True, exist_ok=True)

    def pg_ctl(*args: str) -> None:
        argv = [f"{a.pg_bin}/pg_ctl", "-D", a.pgdata, *args]
        if a.as_postgres:
            argv = ["runuser", "-u", "postgres", "--", *argv]
        print(f"[native] $ {' '.join(argv)}", file=sys.stderr)
        subprocess.run(argv, check=True, cwd="/tmp", stdout=subprocess.DEVNULL)

    def wait_ready(_image: str = "") -> None:
        last: Exception | None = None
        for _ in range(60):
            try:
                with psycopg.connect(ad.pg_url("postgres"), autocommit=True) as c:
                    c.execute("SELECT 1")
                return
            except psycopg.Error as e:
                last = e
                time.sleep(1)
        raise RuntimeError(f"the private Postgres on port {a.port} is not answering: {last}")

    def stop(_image: str = "") -> None:
        pg_ctl("-m", "fast", "-w", "stop")

    def start(_image: str = "") -> None:
        pg_ctl("-l", a.pg_log, "-w", "start")
        wait_ready()

    orch.start_postgres = wait_ready
    orch.stop_postgres = lambda _image="": None  # run-native stops it
    orch._compose_stop_postgres = stop
    orch._compose_start_postgres = start
    orch._restart_postgres = lambda image="": (stop(image), start(image))

    here = Path(__file__).resolve().parent

    def launcher(table):
        def launch(manifest, overrides):
            env = ad._base_env(manifest, overrides)
            # The table shape (see stagedoor-bench) and the pool: not in the harness's list.
            env["STAGEDOOR_TABLE"] = table
            for key in ("STAGEDOOR_POOL", "STAGEDOOR_LEDGER_DIR"):
                if key in os.environ:
                    env[key] = os.environ[key]
            return ad.LaunchSpec(argv=[a.stagedoor_bin], env=env)

        return launch

    # `stagedoor`: the mailer's table (generated id, no headers); `stagedoor-text`: a text id
    # and headers (its manifest in stagedoor-bench/text/).
    ad.ADAPTERS["stagedoor"] = ad.AdapterEntry(
        bench_dir=here / "stagedoor-bench",
        builder=lambda skip: None,  # run-native builds it
        launcher=launcher("mailer"),
    )
    ad.ADAPTERS["stagedoor-text"] = ad.AdapterEntry(
        bench_dir=here / "stagedoor-bench" / "text",
        builder=lambda skip: None,
        launcher=launcher("text"),
    )

    pgboss_dir = a.harness.resolve() / "pgboss-bench"

    def launch_pgboss(manifest, overrides):
        return ad.LaunchSpec(
            argv=["node", str(pgboss_dir / "main.js")],
            env=ad._base_env(manifest, overrides),
            cwd=str(pgboss_dir),
        )

    def build_pgboss(skip: bool) -> None:
        if skip or (pgboss_dir / "node_modules").exists():
            return
        subprocess.run(["npm", "ci", "--no-audit", "--no-fund"], cwd=pgboss_dir, check=True)

    ad.ADAPTERS["pgboss"] = ad.AdapterEntry(
        bench_dir=pgboss_dir, builder=build_pgboss, launcher=launch_pgboss
    )
    # The orchestrator imported ADAPTERS by name: the same dict, already updated.
    assert orch.ADAPTERS is ad.ADAPTERS
    return orch.main(rest)


if __name__ == "__main__":
    raise SystemExit(main())
