"""relaunch as a product: the built wheel, installed into a fresh venv with no torch, is a working `relaunch` for a
bastion or a laptop, and puts nothing but `relaunch` at the top of site-packages."""

from __future__ import annotations

import fnmatch
import os
import re
import tomllib
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


def test_the_wheel_holds_every_file_its_package_data_promises(tmp_path_factory):
    venv = installed_venv(tmp_path_factory.getbasetemp().parent)
    (record,) = next((venv / "lib").glob("python3*/site-packages")).glob("relaunch-*.dist-info/RECORD")
    shipped = {line.split(",")[0] for line in record.read_text().splitlines()}
    setuptools = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    folders = setuptools.get("package-dir", {})
    missing = []
    for package, patterns in setuptools["package-data"].items():
        source = ROOT / folders.get(package, package.replace(".", "/"))
        installed = package.replace(".", "/")
        for pattern in patterns:
            promised = [p.relative_to(source).as_posix() for p in source.glob(pattern) if p.is_file() and "__pycache__" not in p.parts]
            assert promised, f"{package}: {pattern} matches nothing in {source}"
            missing += [f"{installed}/{name}" for name in promised if f"{installed}/{name}" not in shipped]
            assert any(fnmatch.fnmatch(f, f"{installed}/{pattern}") for f in shipped), f"{package}: {pattern} not in the wheel"
    assert not missing, missing


def test_the_wheel_without_torch_says_how_to_get_the_demo_and_where_automations_need_a_server(tmp_path, tmp_path_factory):
    exe = installed_venv(tmp_path_factory.getbasetemp().parent) / "bin" / "relaunch"
    env = clean_env(tmp_path)
    demo = run([str(exe), "demo", "--workdir", str(tmp_path / "demo")], env=env, cwd=tmp_path)
    assert demo.returncode == 2 and "pip install 'relaunch[demo]'" in demo.stderr, demo.stdout + demo.stderr
    assert not (tmp_path / "demo").exists(), "nothing built"
    sync = run([str(exe), "automations", "sync"], env=env, cwd=tmp_path)
    assert sync.returncode == 2 and "PREFECT_API_URL" in sync.stderr, sync.stdout + sync.stderr


def test_every_doc_the_readme_links_to_is_in_the_wheel_and_relaunch_docs_prints_it_as_written(tmp_path, tmp_path_factory):
    exe = installed_venv(tmp_path_factory.getbasetemp().parent) / "bin" / "relaunch"
    env = clean_env(tmp_path)
    linked = sorted(set(re.findall(r"\]\(docs/([a-z0-9-]+)\.md", (ROOT / "README.md").read_text())))
    assert len(linked) >= 5, linked
    listed = run([str(exe), "docs"], env=env, cwd=tmp_path)
    assert listed.returncode == 0 and all(name in listed.stdout.split() for name in linked), listed.stdout + listed.stderr
    for name in linked:
        shown = run([str(exe), "docs", name], env=env, cwd=tmp_path)
        assert shown.returncode == 0 and shown.stdout == (ROOT / "docs" / f"{name}.md").read_text(), (name, shown.stderr[-500:])
    missing = run([str(exe), "docs", "no-such-doc"], env=env, cwd=tmp_path)
    assert missing.returncode == 2 and "operations" in missing.stderr, missing.stderr
