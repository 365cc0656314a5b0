"""Run the app on a local Ray, for `dspark serve`, the tests and the benches: a fresh cluster with Serve's HTTP front
on a free loopback port, and the app deployed there, ready once that port answers with it.

The HTTP front (`http_proxy`): "haproxy" (the default) is Ray Serve's HAProxy ingress: HAProxy listens on the port and
forwards each connection to an ingress replica's own HTTP server (direct ingress), so a streamed response goes from
the replica's socket to the client with no Python process and no Ray message per chunk. "ray" is Serve's Python proxy,
which relays every chunk from the replica as a Ray streaming message. Ray reads the choice from the environment of its
processes when they start (`http_proxy_env`); on a cluster, `ray start` on every node needs it (cluster.yaml).

    with local_serve(num_cpus=4) as port:
        app = run_app(LLMServingConfig(...), port)
        httpx.post(f"{app.base}/v1/completions", json=...)

Serve's proxy binds with SO_REUSEPORT, so starting it on a port that another server already listens on does not
fail: both then answer there. That is why run_app reads /-/routes until the port lists this app's route.
"""
from __future__ import annotations

import logging
import os
import shutil
import socket
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Literal

log = logging.getLogger(__name__)
LOOPBACK = "127.0.0.1"
HttpProxy = Literal["haproxy", "ray"]


def free_port(host: str = LOOPBACK) -> int:
    """A port that nothing listens on right now (the OS's pick)."""
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def http_proxy_env(http_proxy: HttpProxy, run_dir: str | None = None, drain_s: float | None = None) -> dict[str, str]:
    """The environment that selects Serve's HTTP front, for the Ray processes of a cluster about to start.

    haproxy: HAProxy's files go under `run_dir` and its stats and metrics listen on free ports (Ray's defaults:
    /tmp/haproxy-serve and fixed ports, which two servers on one machine would share). `drain_s` sets
    RAY_SERVE_DIRECT_INGRESS_MIN_DRAINING_PERIOD_S, how long a stopping replica keeps serving so that HAProxy can take
    it out first: Ray's default suits a load balancer of its own in front; HAProxy beside the replicas needs less."""
    if http_proxy == "ray":
        return {"RAY_SERVE_ENABLE_HA_PROXY": "0", "RAY_SERVE_ENABLE_DIRECT_INGRESS": "0"}
    if http_proxy != "haproxy":
        raise ValueError(f"http_proxy must be 'haproxy' or 'ray', not {http_proxy!r}")
    env = {"RAY_SERVE_ENABLE_HA_PROXY": "1"}
    if run_dir is not None:
        env |= {"RAY_SERVE_HAPROXY_CONFIG_FILE_LOC": f"{run_dir}/haproxy.cfg",
                "RAY_SERVE_HAPROXY_SOCKET_PATH": f"{run_dir}/admin.sock",
                "RAY_SERVE_HAPROXY_METRICS_SOCKET_PATH": f"{run_dir}/metrics.sock",
                "RAY_SERVE_HAPROXY_SERVER_STATE_BASE": run_dir,
                "RAY_SERVE_HAPROXY_SERVER_STATE_FILE": f"{run_dir}/server-state",
                "RAY_SERVE_HAPROXY_STATS_PORT": str(free_port("")),
                "RAY_SERVE_HAPROXY_METRICS_PORT": str(free_port(""))}
    if drain_s is not None:
        env["RAY_SERVE_DIRECT_INGRESS_MIN_DRAINING_PERIOD_S"] = str(drain_s)
    return env


def haproxy_binary() -> str | None:
    """The HAProxy that Ray would run (the one `ray[serve]` installs on Linux, or one on PATH), or None."""
    from ray.serve._private.haproxy import get_haproxy_binary  # Ray's own lookup; Ray is pinned exactly

    try:
        return get_haproxy_binary()
    except FileNotFoundError:
        return None


@contextmanager
def serve_environment(http_proxy: HttpProxy, drain_s: float | None = 2.0) -> Iterator[dict[str, str]]:
    """Set http_proxy_env in os.environ (with a run folder of its own) for a local cluster started inside, and put
    both back afterwards. Yields the variables set. Without an HAProxy binary (not Linux), Serve's Python proxy."""
    if http_proxy == "haproxy" and haproxy_binary() is None:
        log.warning("no HAProxy binary here (ray[serve] installs one on Linux): Serve's Python proxy serves HTTP")
        http_proxy = "ray"
    # Short: Ray adds a 56-character node id below it, and HAProxy takes socket paths of at most 97 characters.
    run_dir = tempfile.mkdtemp(prefix="dsh-", dir="/tmp") if http_proxy == "haproxy" else None
    env = http_proxy_env(http_proxy, run_dir, drain_s)
    saved = {key: os.environ.get(key) for key in env}
    os.environ.update(env)
    try:
        yield env
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        if run_dir is not None:
            shutil.rmtree(run_dir, ignore_errors=True)


@contextmanager
def local_serve(num_cpus: int = 8, object_store_mb: int = 200, host: str = LOOPBACK,
                http_proxy: HttpProxy = "haproxy") -> Iterator[int]:
    """A fresh local Ray owned by this process (auth off, no dashboard, a capped object store, workers' logs not
    echoed) with Serve's HTTP front (`http_proxy`) on a free port of `host`. Yields the port; shuts Serve and Ray
    down on exit."""
    os.environ["RAY_AUTH_MODE"] = "disabled"  # read when Ray starts
    import ray
    from ray import serve

    with serve_environment(http_proxy):
        # address="local": always a new cluster, never one that RAY_ADDRESS or `ray start` left running.
        ray.init(address="local", num_cpus=num_cpus, object_store_memory=object_store_mb * 2**20,
                 include_dashboard=False, log_to_driver=False)
        try:
            port = free_port(host)
            serve.start(http_options={"host": host, "port": port})
            yield port
        finally:
            try:
                serve.shutdown()
            finally:
                ray.shutdown()


@dataclass
class App:
    """One app deployed by run_app: where it answers, and the config it was built from."""

    name: str
    route_prefix: str
    port: int
    config: object  # LLMServingConfig
    host: str = LOOPBACK

    @property
    def root(self) -> str:
        """The proxy's URL (/-/routes, /-/healthz)."""
        return f"http://{self.host}:{self.port}"

    @property
    def base(self) -> str:
        """The app's own URL: the proxy's plus the route prefix."""
        return self.root + ("" if self.route_prefix == "/" else self.route_prefix)

    def handle(self, deployment: str = "LLMServer"):
        from ray import serve

        return serve.get_deployment_handle(deployment, app_name=self.name)


def run_app(config, port: int, name: str | None = None, route_prefix: str = "/", host: str = LOOPBACK,
            timeout_s: float = 30.0) -> App:
    """serve.run the app of `config` (an LLMServingConfig) on the running Serve, then wait until the proxy at
    host:port lists `route_prefix` for it in /-/routes. `name` defaults to a unique one."""
    import httpx
    from ray import serve

    from deployments.app import build_app

    app = App(name or f"dspark-{uuid.uuid4().hex[:8]}", route_prefix, port, config, host)
    try:
        serve.run(build_app(config), name=app.name, route_prefix=route_prefix)
    except RuntimeError as exc:  # Serve's says only which deployments failed; their status says why
        status = serve.status().applications.get(app.name)
        reasons = [f"{name}: {d.message}" for name, d in (status.deployments.items() if status else ())
                   if d.message]
        raise RuntimeError("; ".join([str(exc)] + reasons)) from exc
    deadline, listed = time.monotonic() + timeout_s, 0
    while listed < 4:  # listed, then on three more connections: a second server would take some of them
        # A new connection each time, so that the kernel spreads them over every listener on the port.
        routes = httpx.get(f"{app.root}/-/routes", timeout=10).json()
        if routes.get(route_prefix) == app.name:
            listed += 1
            continue
        if listed:
            raise RuntimeError(f"{app.root} answered {routes} after listing {app.name!r}: another server listens there")
        if time.monotonic() > deadline:
            raise RuntimeError(f"{app.root}/-/routes lists {routes}, not {route_prefix!r}: {app.name!r}")
        time.sleep(0.2)
    return app
