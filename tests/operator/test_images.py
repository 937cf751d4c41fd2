"""The images the chart runs are the ones ``scripts/build-images.sh`` builds: one per
component from its Containerfile, tagged with the package version, the chart's appVersion.
(No container engine runs on the test machine: the commands are checked, not run.)"""

from __future__ import annotations

import os
import subprocess
import tomllib
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "build-images.sh"


def _run(*args: str, tool: str | None = None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, **({"JITSERVE_IMAGE_TOOL": tool} if tool else {})}
    return subprocess.run([str(SCRIPT), *args], capture_output=True, text=True, env=env,
                          timeout=60)


def test_the_chart_runs_the_images_the_script_tags() -> None:
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    chart = yaml.safe_load((ROOT / "charts/jitserve/Chart.yaml").read_text())
    values = yaml.safe_load((ROOT / "charts/jitserve/values.yaml").read_text())
    assert chart["appVersion"] == version
    wanted = {values["image"]["repository"], values["sidecarImage"]["repository"],
              values["analyzerImage"]["repository"]}
    out = _run("--print", tool="podman")
    assert out.returncode == 0, out.stderr
    builds = [line.split() for line in out.stdout.splitlines()]
    assert {b[b.index("-t") + 1] for b in builds} == {f"{r}:{version}" for r in wanted}
    for b in builds:
        assert b[:2] == ["podman", "build"] and (ROOT / b[b.index("-f") + 1]).is_file()


def test_a_registry_prefix_and_push() -> None:
    out = _run("--registry", "ghcr.io/team/", "--push", tool="echo")  # runs `echo build ...`
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert [line.split()[0] for line in lines] == ["build", "push"] * 3
    assert all("ghcr.io/team/" in line and "//" not in line for line in lines)


def test_a_bad_argument_is_a_clear_error() -> None:
    out = _run("--bogus")
    assert out.returncode == 2 and "unknown argument: --bogus" in out.stderr


def test_the_readmes_helm_settings_run_the_images_the_script_pushed() -> None:
    """README: build-images.sh --registry R --push, then helm install --set
    image.repository=R/operator --set sidecarImage.repository=R/sidecar --set
    analyzerImage.repository=R/analyzer: the chart, rendered by Helm's SDK, runs exactly
    the pushed tags."""
    from scripts import render_manifests as render

    registry = "registry.example.com/team"
    out = _run("--registry", registry, "--print", tool="podman")
    pushed = {line.split()[-2] for line in out.stdout.splitlines()}
    values = {"image": {"repository": f"{registry}/operator"},
              "sidecarImage": {"repository": f"{registry}/sidecar"},
              "analyzerImage": {"repository": f"{registry}/analyzer"}}
    readme = " ".join((ROOT / "README.md").read_text().split())
    for key, value in (("image.repository", "REGISTRY/operator"),
                       ("sidecarImage.repository", "REGISTRY/sidecar"),
                       ("analyzerImage.repository", "REGISTRY/analyzer")):
        assert f"--set {key}={value}" in readme
    (deployment,) = [d for d in render.render_documents(values) if d["kind"] == "Deployment"]
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    env = {e["name"]: e["value"] for e in container["env"] if "value" in e}
    assert {container["image"], env["JITSERVE_SIDECAR_IMAGE"],
            env["JITSERVE_ANALYZER_IMAGE"]} == pushed
