"""The deployment files in ``deploy/`` checked by the tools their platforms use: the systemd
units by ``systemd-analyze verify``, the container recipe by hadolint, the Kubernetes manifests
against the Kubernetes schemas, the alert rules by ``promtool check rules``; and each checked
against the code it runs: the commands exist, the settings load, the versions agree.

Building the image and running the units need a container runtime and systemd as PID 1,
which this machine does not have; what can be checked without them is checked here.
"""

from __future__ import annotations

import configparser
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import yaml
from watchkeeper.triggerer.cli import build_parser
from watchkeeper.triggerer.settings import load_settings

from tests.support.requires import unavailable

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"
UNITS = sorted((DEPLOY / "systemd").glob("*.service"))
MANIFESTS = sorted((DEPLOY / "kubernetes").glob("*.yaml"))
INSTALLED = "/opt/watchkeeper/bin/watchkeeper"
"""Where the units expect the command (a virtual environment under /opt/watchkeeper)."""


def _version() -> str:
    with (REPO / "store" / "pyproject.toml").open("rb") as f:
        return str(tomllib.load(f)["project"]["version"])


def _tool(name: str) -> str:
    """The path of ``name`` (on PATH or beside this interpreter); skipped when missing, and
    failed instead under ``CI=true``, where every tool is installed."""
    found = shutil.which(name) or shutil.which(name, path=str(Path(sys.executable).parent))
    if found:
        return found
    unavailable(f"{name} is not installed")


def _run(*command: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)


def _documents(path: Path) -> list[dict[str, Any]]:
    with path.open() as f:
        return [d for d in yaml.safe_load_all(f) if d]


def _unit(path: Path) -> configparser.ConfigParser:
    unit = configparser.ConfigParser(strict=False, interpolation=None)
    unit.optionxform = str  # type: ignore[assignment,method-assign]
    unit.read(path)
    return unit


class TestSystemd:
    def test_the_units_verify(self, tmp_path: Path) -> None:
        """``systemd-analyze verify`` finds nothing to say about any unit (the command path is
        pointed at this environment's ``watchkeeper``, which must exist for it to verify)."""
        analyze = _tool("systemd-analyze")
        script = Path(sys.executable).with_name("watchkeeper")
        assert script.is_file(), script
        assert [u.name for u in UNITS] == [
            "watchkeeper-api.service",
            "watchkeeper-triggerer.service",
            "watchkeeper-worker.service",
        ]
        for unit in UNITS:
            copy = tmp_path / unit.name
            text = unit.read_text()
            assert INSTALLED in text, unit.name
            copy.write_text(text.replace(INSTALLED, str(script)))
            done = _run(analyze, "verify", str(copy))
            assert (done.returncode, done.stdout + done.stderr) == (0, ""), unit.name

    def test_each_unit_runs_a_real_command_that_tells_systemd_it_is_ready(self) -> None:
        """Each unit's command is a subcommand of the CLI with a settings file; the units use
        ``Type=notify``, so the command must send READY=1 (tests/triggerer/test_service_notify.py)."""
        for path in UNITS:
            service = _unit(path)["Service"]
            command = service["ExecStart"].split()
            assert command[:3] == [INSTALLED, "--config", "/etc/watchkeeper/watchkeeper.toml"]
            args = build_parser().parse_args(command[1:])  # exits (fails) on an unknown command
            assert args.command == command[3] and path.stem == f"watchkeeper-{command[3]}"
            assert service["Type"] == "notify" and service["User"] == "watchkeeper"
            assert service["NoNewPrivileges"] == "yes" and service["ProtectSystem"] == "strict"


class TestContainer:
    def test_the_recipe_lints_clean(self) -> None:
        hadolint = _tool("hadolint")
        done = _run(hadolint, "--no-color", str(DEPLOY / "container" / "Dockerfile"))
        assert (done.returncode, done.stdout + done.stderr) == (0, "")

    def test_it_installs_this_version_and_runs_as_a_user(self) -> None:
        text = (DEPLOY / "container" / "Dockerfile").read_text()
        assert f"ARG WATCHKEEPER_VERSION={_version()}\n" in text
        assert re.search(r"^FROM python:3\.\d+-slim", text, re.MULTILINE)
        assert re.search(r"^USER 10001", text, re.MULTILINE)
        assert "/healthz" in re.search(r"^HEALTHCHECK .*$\n.*$", text, re.MULTILINE)[0]  # type: ignore[index]


class TestKubernetes:
    def test_the_manifests_match_the_schemas(self) -> None:
        """Every resource of a built-in kind passes strict validation; the ServiceMonitor (a
        Prometheus Operator kind, whose schema does not ship) is checked by the next test."""
        validate = _tool("kubernetes-validate")
        done = _run(validate, "--strict", *map(str, MANIFESTS))
        assert done.returncode == 0, done.stdout + done.stderr
        kinds = [d["kind"] for m in MANIFESTS for d in _documents(m)]
        passed = done.stdout.count(" passed for resource ")
        assert passed == len(kinds) - kinds.count("ServiceMonitor"), done.stdout

    def test_they_fit_together_and_fit_the_code(self, tmp_path: Path) -> None:
        """Images at this version, probes on /healthz and /readyz, the ServiceMonitor on the
        Service's port, the database URL from the Secret, and settings our model loads."""
        resources = {
            (d["kind"], d["metadata"]["name"]): d for m in MANIFESTS for d in _documents(m)
        }
        triggerer = resources[("Deployment", "watchkeeper-triggerer")]["spec"]["template"]["spec"]
        (container,) = triggerer["containers"]
        assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
        assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
        for name in ("watchkeeper-triggerer", "watchkeeper-worker"):
            (each,) = resources[("Deployment", name)]["spec"]["template"]["spec"]["containers"]
            assert each["image"] == f"watchkeeper:{_version()}"
            (url,) = [e for e in each["env"] if e["name"] == "WATCHKEEPER__DATABASE__URL"]
            assert url["valueFrom"]["secretKeyRef"]["name"] == "watchkeeper-database"
        service_ports = [
            p["name"] for p in resources[("Service", "watchkeeper-triggerer")]["spec"]["ports"]
        ]
        (endpoint,) = resources[("ServiceMonitor", "watchkeeper")]["spec"]["endpoints"]
        assert endpoint["port"] in service_ports and endpoint["path"] == "/metrics"
        config = resources[("ConfigMap", "watchkeeper-config")]["data"]["watchkeeper.toml"]
        (tmp_path / "watchkeeper.toml").write_text(config)
        settings = load_settings(tmp_path / "watchkeeper.toml")
        assert (settings.api.host, settings.api.port) == ("0.0.0.0", 8787)
        watchers = resources[("ConfigMap", "watchkeeper-watchers")]["data"]
        for name, source in watchers.items():
            compile(source, name, "exec")


class TestPrometheus:
    def test_the_alert_rules_check(self) -> None:
        promtool = _tool("promtool")
        done = _run(promtool, "check", "rules", str(DEPLOY / "prometheus" / "alerts.yml"))
        assert done.returncode == 0, done.stdout + done.stderr

    def test_the_alerts_use_metrics_the_code_exposes(self) -> None:
        """Each ``watchkeeper_*`` series an alert reads is one the API's collectors define (a
        renamed metric would leave an alert that never fires)."""
        rules = (DEPLOY / "prometheus" / "alerts.yml").read_text()
        used = set(re.findall(r"\bwatchkeeper_[a-z_]+\b", rules))
        code = "".join(
            p.read_text() for p in (REPO / "triggerer" / "src").rglob("*.py") if "api" in p.parts
        )
        defined = set(re.findall(r"\bwatchkeeper_[a-z_]+\b", code))
        assert len(used) >= 6
        assert sorted(used - defined) == []
