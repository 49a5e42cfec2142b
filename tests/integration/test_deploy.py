"""The deployment recipes in deploy/: the KubeRay RayJob manifest against its schema and against verl's own
config checks (the entrypoint is a command line verl accepts, sized to the pods it asks for), and the
Dockerfiles against the package they install. No cluster or image is built here."""

from __future__ import annotations

import copy
import json
import re
import shlex
import subprocess
import sys
from importlib.metadata import metadata
from pathlib import Path

import pytest

jsonschema = pytest.importorskip("jsonschema")
yaml = pytest.importorskip("yaml")

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
MANIFEST = DEPLOY / "kuberay" / "rayjob-grpo.yaml"
LAUNCHER = ["python", "-m", "verl.trainer.main_ppo"]


def _validator():
    schema = json.loads((DEPLOY / "kuberay" / "rayjob.schema.json").read_text())
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema)


def _manifest() -> dict:
    return yaml.safe_load(MANIFEST.read_text())


def _overrides(manifest: dict) -> dict[str, str]:
    argv = shlex.split(manifest["spec"]["entrypoint"])
    assert argv[:3] == LAUNCHER, argv[:3]
    return dict(arg.split("=", 1) for arg in argv[3:])


def _pods(manifest: dict) -> list[tuple[dict, int]]:
    """Every pod template of the cluster with how many pods it makes (the head: one)."""
    cluster = manifest["spec"]["rayClusterSpec"]
    pods = [(cluster["headGroupSpec"]["template"], 1)]
    pods += [(group["template"], group["replicas"]) for group in cluster.get("workerGroupSpecs", [])]
    return pods


def test_the_manifest_matches_the_rayjob_schema():
    errors = [e.message for e in _validator().iter_errors(_manifest())]
    assert not errors, errors


@pytest.mark.parametrize(
    "damage, complaint",
    [
        (lambda m: m["spec"]["rayClusterSpec"].update(workerGroupSpec=[]), "'workerGroupSpec' was unexpected"),
        (lambda m: m["spec"]["rayClusterSpec"]["headGroupSpec"]["rayStartParams"].update({"num-cpus": 4}),
         "4 is not of type 'string'"),
        (lambda m: m["spec"].update(submissionMode="K8sJob"), "is not one of"),
        (lambda m: m["spec"]["rayClusterSpec"]["workerGroupSpecs"][0].pop("groupName"), "'groupName' is a required"),
    ],
)  # fmt: skip
def test_the_schema_refuses_what_kuberay_would_refuse_or_drop(damage, complaint):
    manifest = copy.deepcopy(_manifest())
    damage(manifest)
    messages = [e.message for e in _validator().iter_errors(manifest)]
    assert any(complaint in message for message in messages), messages


def test_the_entrypoint_is_sized_to_the_pods():
    manifest = _manifest()
    overrides = _overrides(manifest)
    pods = _pods(manifest)
    assert overrides["trainer.backend"] == "ray"
    assert int(overrides["trainer.nnodes"]) == sum(count for _, count in pods)  # the head trains too
    for template, _ in pods:
        for container in template["spec"]["containers"]:
            gpus = container["resources"]["limits"]["nvidia.com/gpu"]
            assert gpus == int(overrides["trainer.n_gpus_per_node"]), container["name"]
            mounts = {mount["name"] for mount in container["volumeMounts"]}
            assert mounts <= {volume["name"] for volume in template["spec"]["volumes"]}
    # every path the run reads or writes is on the volume all pods share, so any pod can run the driver
    shared = {m["mountPath"] for t, _ in pods for c in t["spec"]["containers"] for m in c["volumeMounts"]}
    for key in (
        "data.train_files",
        "data.val_files",
        "actor_rollout_ref.model.path",
        "trainer.default_local_dir",
    ):
        assert any(overrides[key].startswith(path + "/") for path in shared - {"/dev/shm"}), key


def test_verl_accepts_the_entrypoint_command_line(tmp_path):
    """The overrides go through verl's own loading and checks (a typo in a key would exit 2 here)."""
    argv = shlex.split(_manifest()["spec"]["entrypoint"])
    run = subprocess.run(
        [sys.executable, *argv[1:], "--print-config"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    assert re.search(r"^\s+nnodes: 2$", run.stdout, re.M) and re.search(
        r"^\s+backend: ray$", run.stdout, re.M
    )
    assert not any(tmp_path.iterdir())  # printing the config writes nothing


@pytest.mark.parametrize("dockerfile", ["Dockerfile.cpu", "Dockerfile.gpu"])
def test_the_dockerfiles_install_this_package_with_extras_it_has(dockerfile):
    text = (DEPLOY / dockerfile).read_text()
    extras = set(metadata("verl").get_all("Provides-Extra"))
    (installed,) = re.findall(r'-e "\.\[([\w,-]+)\]"', text)
    assert set(installed.split(",")) <= extras, installed
    assert "ray" in installed.split(",")  # ray[default]: the job server `ray job submit` needs
    for source in re.findall(r"^COPY (.+) \S+$", text, re.M):
        for path in source.split():
            assert (ROOT / path).exists(), f"{dockerfile} copies {path}, which is not in the repository"
    assert "RAY_AUTH_MODE=token" in text
    if dockerfile == "Dockerfile.cpu":
        assert "-c constraints-cpu.txt" in text  # the CPU torch, as in CI
