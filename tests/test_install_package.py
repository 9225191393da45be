"""The missing-dependency remedy installs what the diagnosis named and changes nothing else the venv holds: a
package the lock pins comes at its pin, what came with it is named, and an install that would move one of the
venv's own packages is refused, naming why, with the venv as it was. Real uv, real wheels, a real venv."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from relaunch.demo.wheels import write_wheel
from relaunch.errors import CommandFailed
from relaunch.steps import InstallDetail
from relaunch.tasks.install_package import install_package
from relaunch.testing.faults import making
from relaunch.wire.transport import local_env


@pytest.fixture
def target(tmp_path):
    with making(tmp_path) as make:
        t = make()
        wheels = Path(t.find_links[0])
        for name, version, requires in [
            ("depa", "1.0", ()),
            ("depa", "2.0", ()),
            ("needs_dep", "1.0", ("depa",)),
            ("tinyjunk", "0.2.0", ()),
            ("wants_newer", "1.0", ("tinyjunk>=0.2",)),
        ]:
            write_wheel(wheels, name, version, {f"{name.replace('-', '_')}/__init__.py": b""}, requires=requires)
        subprocess.run(["uv", "venv", "-q", "--python", t.python, t.venv_dir], check=True, env=local_env())
        lock_install(t)
        yield t


def lock_install(t) -> None:
    py = f"{t.venv_dir}/bin/python"
    subprocess.run(
        ["uv", "pip", "install", "-q", "--python", py, "--no-index", "--find-links", t.find_links[0], "-r", t.lock_path],
        check=True,
        env=local_env(),
    )


def freeze(t) -> list[str]:
    out = subprocess.run(
        ["uv", "pip", "freeze", "--python", f"{t.venv_dir}/bin/python"], capture_output=True, text=True, check=True, env=local_env()
    )
    return sorted(out.stdout.split())


def test_a_missing_package_comes_with_what_it_needs_named_and_the_venvs_own_packages_unmoved(target):
    before = freeze(target)
    detail = install_package.fn(target, "needs-dep").detail
    assert isinstance(detail, InstallDetail)
    assert detail.added == ["depa==2.0", "needs-dep==1.0"], detail
    assert freeze(target) == sorted([*before, "depa==2.0", "needs-dep==1.0"]), "tinyjunk stays at the lock's 0.1.0"
    assert detail.notes() == ["installed depa==2.0, needs-dep==1.0 (depa==2.0 came with needs-dep): add to the lock"]


def test_a_package_the_lock_pins_is_installed_at_its_pin_not_the_newest(target):
    Path(target.lock_path).write_text("tinyjunk==0.1.0\nDepA==1.0  # pinned by hand\n")
    detail = install_package.fn(target, "depa").detail
    assert detail.added == ["depa==1.0"], detail


def test_an_install_that_would_move_a_package_of_the_venv_is_refused_and_the_venv_is_left_as_it_was(target):
    before = freeze(target)
    with pytest.raises(CommandFailed) as refused:
        install_package.fn(target, "wants-newer")
    text = str(refused.value)
    assert text.startswith("on local: `uv pip install wants-newer` exited"), text
    assert "fits the venv's packages as they are" in text and "tinyjunk" in text and "what to do:" in text, text
    assert freeze(target) == before
