"""relaunch as a product: the built wheel, installed into a fresh venv with no torch, is a working `relaunch` for a
bastion or a laptop, and puts nothing but `relaunch` at the top of site-packages."""

from __future__ import annotations

import os
from pathlib import Path

import yaml

from relaunch.testing.targets import shell_target
from tests.installed import clean_env, installed_venv, run

ROOT = Path(__file__).resolve().parent.parent


def test_the_wheel_installed_without_torch_runs_version_diagnose_dry_run_and_check(tmp_path, tmp_path_factory):
    venv = installed_venv(tmp_path_factory.getbasetemp().parent)
    site = next((venv / "lib").glob("python3*/site-packages"))
    (record,) = site.glob("relaunch-*.dist-info/RECORD")
    tops = {line.split(",")[0].split("/")[0] for line in record.read_text().splitlines()}
    assert {t for t in tops if not t.endswith(".dist-info") and t != ".."} == {"relaunch"}, tops
    assert not list(site.glob("torch*")), "no torch for a bastion"

    exe = venv / "bin" / "relaunch"
    env = clean_env(tmp_path)
    assert run([str(exe), "--version"], env=env).stdout.startswith("relaunch ")
    log = next((ROOT / "tests" / "fixtures" / "logs").rglob("*.log"))
    diagnosed = run([str(exe), "diagnose", str(log), "--exit-code", "1"], env=env)
    assert diagnosed.returncode in (0, 1) and "verdict:" in diagnosed.stdout, diagnosed.stdout + diagnosed.stderr

    target = shell_target(tmp_path / "t")
    path = tmp_path / "target.yaml"
    path.write_text(yaml.safe_dump(target.model_dump(mode="json")))
    dry = run([str(exe), "recover", "--dry-run", str(path)], env=env)
    assert dry.returncode == 0 and "# build_venv" in dry.stdout and "# launch" in dry.stdout, dry.stdout + dry.stderr
    checked = run([str(exe), "check", str(path)], env=env, cwd=tmp_path)
    assert checked.returncode == 1 and "unknown" in checked.stdout, checked.stdout + checked.stderr[-2000:]
    assert not os.path.exists(target.venv_dir), "a check changes nothing"
