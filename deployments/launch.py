"""Run the app on a local Ray, for the tests and the benches: a fresh cluster with Serve's HTTP proxy on a free
loopback port, and the app deployed there, ready once that port answers with it.

    with local_serve(num_cpus=4) as port:
        app = run_app(LLMServingConfig(...), port)
        httpx.post(f"{app.base}/v1/completions", json=...)

Serve's proxy binds with SO_REUSEPORT, so starting it on a port that another server already listens on does not
fail: both then answer there. That is why run_app reads /-/routes until the port lists this app's route.
"""
from __future__ import annotations

import os
import socket
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

LOOPBACK = "127.0.0.1"


def free_port(host: str = LOOPBACK) -> int:
    """A port that nothing listens on right now (the OS's pick)."""
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


@contextmanager
def local_serve(num_cpus: int = 8, object_store_mb: int = 200, host: str = LOOPBACK) -> Iterator[int]:
    """A fresh local Ray owned by this process (auth off, no dashboard, a capped object store, workers' logs not
    echoed) with Serve's proxy on a free port of `host`. Yields the port; shuts Serve and Ray down on exit."""
    os.environ["RAY_AUTH_MODE"] = "disabled"  # read when Ray starts
    import ray
    from ray import serve

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
