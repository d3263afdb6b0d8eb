"""det serve's proxy to interactive tasks (issue 33): what ``/proxy/<task>/`` adds over the
task's port directly.

Brings up a private embedded PostgreSQL (or ``DET_DB_URL``'s server), a notebook task row
whose run is RUNNING with its address on a stand-in server this script starts in a process of
its own (uvicorn: a 1 MiB body, a tiny one, a WebSocket echo, all under ``/proxy/<id>/``), and
``det serve``; then, interleaving direct and proxied so that load drifts hit both alike:

- 1 MiB: ``GET`` of a 1 MiB body, client round trip, p50 direct vs through the proxy;
- small: a 2-byte body, the same (what authorising every request costs: det_web.auth and
  det_user.task_open, one short transaction);
- WebSocket: one connection each, 100 echo round trips of a short text frame, p50 of each.

Goals (the issue): proxy overhead p50 <= 2 ms on the 1 MiB response, and <= 2 ms on a
WebSocket round trip. Figures only.

    python bench/proxy.py [--n 200] [--echoes 100]
"""

import argparse
import os
import socket
import statistics
import subprocess
import sys
import time

import httpx
import psycopg
from private_db import private_database
from psycopg.rows import dict_row
from websockets.sync.client import connect

from det.cli.users import password_verifier

PASSWORD = "the bench's password"
MIB = b"x" * 2**20


def upstream_app(job: int):
    """The stand-in for a task's server (run with ``--upstream PORT JOB``)."""
    from starlette.applications import Starlette
    from starlette.responses import Response
    from starlette.routing import Route, WebSocketRoute

    async def big(request):
        return Response(MIB, media_type="application/octet-stream")

    async def small(request):
        return Response(b"ok", media_type="text/plain")

    async def echo(ws):
        await ws.accept()
        while True:
            message = await ws.receive()
            if message["type"] == "websocket.disconnect":
                return
            await ws.send_text(message["text"])

    return Starlette(routes=[Route(f"/proxy/{job}/big", big),
                             Route(f"/proxy/{job}/small", small),
                             WebSocketRoute(f"/proxy/{job}/ws", echo)])


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_http(url: str, proc: subprocess.Popen, what: str) -> None:
    for _ in range(600):
        try:
            httpx.get(url, timeout=1)
            return
        except httpx.TransportError:
            if proc.poll() is not None:
                raise SystemExit(f"{what} exited with {proc.returncode}") from None
            time.sleep(0.1)
    raise SystemExit(f"{what} did not start")


def p50(xs: list[float]) -> float:
    return statistics.median(xs)


def get_ms(client: httpx.Client, url: str, size: int, server: list[float] | None = None
           ) -> float:
    """The round trip of ``GET url`` in milliseconds; det serve's own time up to the answer's
    headers (its Server-Timing) appended to ``server``."""
    t0 = time.perf_counter()
    r = client.get(url)
    ms = (time.perf_counter() - t0) * 1000
    assert r.status_code == 200 and len(r.content) == size, (r.status_code, r.text[:200])
    if server is not None:
        server.append(float(r.headers["server-timing"].split("dur=")[1]))
    return ms


def echo_ms(ws, n: int) -> list[float]:
    out = []
    for i in range(n):
        t0 = time.perf_counter()
        ws.send(f"ping {i}")
        assert ws.recv() == f"ping {i}"
        out.append((time.perf_counter() - t0) * 1000)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=200, help="requests of each kind (default 200)")
    ap.add_argument("--echoes", type=int, default=100, help="WebSocket round trips (100)")
    args = ap.parse_args()
    with private_database() as db:
        env = {**os.environ, "DET_DB_URL": db.url}
        with psycopg.connect(db.url, autocommit=True, row_factory=dict_row) as conn:
            conn.execute("SELECT det_user.user_create('bench', %s, true)",
                         (password_verifier(conn, "bench", PASSWORD),))
            conn.execute("INSERT INTO agents (id, hostname, resource_pool, runtime) "
                         "VALUES ('bench', 'localhost', 'default', 'process')")
        port = free_port()
        serve = subprocess.Popen([sys.executable, "-m", "det.cli.main", "serve", "--port",
                                  str(port)], env=env, stdout=subprocess.DEVNULL,
                                 stderr=subprocess.DEVNULL)
        procs = [serve]
        try:
            base = f"http://127.0.0.1:{port}"
            wait_http(f"{base}/api/v1/openapi.json", serve, "det serve")
            token = httpx.post(f"{base}/api/v1/auth/login",
                               json={"username": "bench", "password": PASSWORD}).json()["token"]
            auth = {"Authorization": f"Bearer {token}"}
            job = httpx.post(f"{base}/api/v1/notebooks", headers=auth,
                             json={"force": True}).json()["id"]
            up_port = free_port()
            upstream = subprocess.Popen([sys.executable, __file__, "--upstream", str(up_port),
                                         str(job)], stdout=subprocess.DEVNULL,
                                        stderr=subprocess.DEVNULL)
            procs.append(upstream)
            direct = f"http://127.0.0.1:{up_port}/proxy/{job}"
            wait_http(f"{direct}/small", upstream, "the stand-in server")
            with psycopg.connect(db.url, autocommit=True) as conn:
                conn.execute("UPDATE allocations SET state = 'RUNNING', agent_id = 'bench', "
                             "address = %s WHERE job_id = %s", (f"127.0.0.1:{up_port}", job))
            proxied = f"{base}/proxy/{job}"
            figures: dict[str, dict[str, list[float]]] = {}
            with httpx.Client(timeout=30) as plain, httpx.Client(timeout=30,
                                                                  headers=auth) as logged:
                for name, path, size in (("1 MiB", "/big", 2**20), ("small", "/small", 2)):
                    d, p, st = [], [], []
                    for _ in range(5):  # warm both paths' connections
                        get_ms(plain, direct + path, size)
                        get_ms(logged, proxied + path, size)
                    for _ in range(args.n):
                        d.append(get_ms(plain, direct + path, size))
                        p.append(get_ms(logged, proxied + path, size, st))
                    figures[name] = {"direct": d, "proxied": p, "headers": st}
                # what any authenticated request costs det serve: GET /api/v1/me's own time
                me = []
                for _ in range(args.n):
                    r = logged.get(f"{base}/api/v1/me")
                    me.append(float(r.headers["server-timing"].split("dur=")[1]))
            ws_base = f"ws://127.0.0.1:{up_port}/proxy/{job}/ws"
            with connect(ws_base, max_size=None) as wd, \
                    connect(f"ws://127.0.0.1:{port}/proxy/{job}/ws", additional_headers=auth,
                            max_size=None) as wp:
                echo_ms(wd, 10)
                echo_ms(wp, 10)
                figures["WebSocket echo"] = {"direct": echo_ms(wd, args.echoes),
                                             "proxied": echo_ms(wp, args.echoes)}
        finally:
            for p in procs:
                p.terminate()
            for p in procs:
                p.wait(20)
    print(f"GET /api/v1/me, det serve's own time (one authenticated request): p50 "
          f"{p50(me):.2f} ms")
    print(f"{'':<16} {'direct p50':>12} {'proxied p50':>12} {'overhead p50':>13} "
          f"{'det serve to headers p50':>25}")
    for name, f in figures.items():
        d, p = p50(f["direct"]), p50(f["proxied"])
        st = f"{p50(f['headers']):22.2f} ms" if f.get("headers") else ""
        print(f"{name:<16} {d:9.2f} ms {p:9.2f} ms {p - d:10.2f} ms {st}   "
              f"(n={len(f['direct'])} each)")


if __name__ == "__main__":
    if sys.argv[1:2] == ["--upstream"]:
        import uvicorn

        uvicorn.run(upstream_app(int(sys.argv[3])), host="127.0.0.1", port=int(sys.argv[2]),
                    log_level="warning")
    else:
        main()
