"""cluster.yaml (for `ray up`) against Ray's own cluster-launcher schema, plus what this project needs of it."""
from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml

pytest.importorskip("jsonschema")
from ray.autoscaler._private.util import prepare_config, validate_config  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def config() -> dict:
    return yaml.safe_load((ROOT / "cluster.yaml").read_text())


def test_valid_for_ray_up(config):
    # What `ray up` does before launching anything: merge the provider's defaults, then validate (schema, node
    # types, worker counts).
    validate_config(prepare_config(copy.deepcopy(config)))
    validate_config(copy.deepcopy(config))  # the file as written is already complete


def test_schema_rejects_a_typo(config):
    import jsonschema

    bad = copy.deepcopy(config)
    bad["available_node_types"]["gpu_worker"]["min_worker"] = 1
    with pytest.raises(jsonschema.ValidationError):
        validate_config(bad)


def test_gpu_workers_and_counts(config):
    types = config["available_node_types"]
    head = config["head_node_type"]
    workers = {k: v for k, v in types.items() if k != head}
    assert workers and all(v["resources"].get("GPU", 0) >= 1 for v in workers.values())
    assert types[head]["resources"].get("GPU", 0) == 0
    for v in workers.values():
        assert 0 <= v["min_workers"] <= v["max_workers"] <= config["max_workers"]


def test_setup_installs_the_project_like_setup_sh(config):
    repo = "~/dspark-serve"
    assert config["file_mounts"][repo] == "."
    common = " ".join(config["setup_commands"])
    assert "python3.11 -m venv .venv" in common
    for key, index in (("head_setup_commands", "whl/cpu"), ("worker_setup_commands", None)):
        cmds = config[key]
        torch = next(i for i, c in enumerate(cmds) if "torch==2.13.0" in c)
        setup = next(i for i, c in enumerate(cmds) if "scripts/setup.sh" in c)
        assert torch < setup, key  # the pinned build first, so setup.sh finds torch satisfied
        assert all(c.startswith(f"cd {repo}") for c in cmds[:setup + 1])
        if index:
            assert index in cmds[torch]
        else:
            assert "--index-url" not in cmds[torch]  # PyPI's default Linux wheel: the CUDA build
    # the pins agree with the project's
    assert "torch==2.13.0" in (ROOT / "scripts" / "setup.sh").read_text()
    assert '"torch==2.13.0"' in (ROOT / "pyproject.toml").read_text()


def test_ray_starts_from_the_venv_without_auth_and_exports_metrics(config):
    head = " ".join(config["head_start_ray_commands"])
    workers = " ".join(config["worker_start_ray_commands"])
    for cmds in (head, workers):
        assert "RAY_AUTH_MODE=disabled" in cmds
        assert "RAY_SERVE_ENABLE_HA_PROXY=1" in cmds  # HAProxy's front, read when Ray starts (launch.http_proxy_env)
        assert "~/dspark-serve/.venv/bin/ray start" in cmds
        assert "--metrics-export-port=8080" in cmds
    assert "--head" in head and "--dashboard-host=0.0.0.0" in head and "--autoscaling-config" in head
    assert "--address=$RAY_HEAD_IP:6379" in workers


def test_images_can_install_the_pinned_torch_and_ray(config):
    """Every node type names its image (Ray's default AMI, Ubuntu 18.04 with glibc 2.27 and CUDA 11, cannot install
    torch 2.13's manylinux_2_28 wheels), by an SSM public parameter EC2 resolves at launch: Ubuntu 22.04 or later,
    and on GPU workers AWS's image with the NVIDIA driver. Ray is pinned exactly, so every node runs the head's."""
    import re

    import ray

    types = config["available_node_types"]
    for name, node in types.items():
        image = node["node_config"]["ImageId"]
        assert image.startswith("resolve:ssm:/aws/service/"), (name, image)
        assert int(re.search(r"ubuntu[-/](?:server/)?(\d\d)\.04", image).group(1)) >= 22, (name, image)
        if node["resources"].get("GPU", 0):
            assert "nvidia-driver-gpu" in image, (name, image)
    assert f'"ray[serve]=={ray.__version__}"' in (ROOT / "pyproject.toml").read_text()
    assert (ROOT / "configs" / "serve_gpu.yaml").exists() and "serve_gpu.yaml" in " ".join(
        line for line in (ROOT / "cluster.yaml").read_text().splitlines() if line.startswith("#"))
