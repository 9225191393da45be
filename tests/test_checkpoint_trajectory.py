"""Which checkpoint is the newest complete one (issue 44): the run's own trajectory, not the highest number, and a
folder of no known layout judged by its content, not by a time window.

Each class is reproduced with real files (torch.save zips, safetensors, .npy, pickles, JSON) listed by the real host
script (`relaunch/host/list_checkpoints.sh`) with the run's records written where launch.sh and adopt.sh write them.
The property (Hypothesis, pure, over generated histories of runs: counters that start again each epoch or stage,
rollbacks, folders whose files are written in any order and cut anywhere): the choice is the newest complete save of
the run's own trajectory, or an escalation that says why; never a cut one, never an older one in silence.
"""

from __future__ import annotations

import io
import json
import os
import pickle
import struct
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from relaunch import runlayout
from relaunch.config import Target
from relaunch.deciding.checkpoint_formats import judge_file
from relaunch.deciding.checkpoint_reasons import Reason
from relaunch.deciding.checkpoints import Choice, Entry, EntryProbe, Probe, RunFacts, choose
from relaunch.errors import CheckpointUnusable
from relaunch.plans.checkpoint_listing import read_listing
from relaunch.tasks.launch import describe, pick_checkpoint
from tests.test_checkpoint_choice import base, listed, target  # noqa: F401 - the shared target fixtures and the host listing
from tests.test_checkpoint_content import safetensors_bytes, torch_bytes

HOUR = 3600.0

# ---------------------------------------------------------------------------------------------
# Real bytes of each format


def npy_bytes(shape: tuple[int, ...] = (3, 5), descr: str = "<f4", version: int = 1) -> bytes:
    """A .npy file written from its spec (numpy is not in the venv): magic, version, header length, a dict literal
    header padded with spaces to 64 bytes and ending in a newline, then the data."""
    header = f"{{'descr': '{descr}', 'fortran_order': False, 'shape': {shape!r}, }}".encode("latin-1")
    start = 10 if version == 1 else 12
    header += b" " * (-(start + len(header) + 1) % 64) + b"\n"
    size = struct.pack("<H" if version == 1 else "<I", len(header))
    count = 1
    for d in shape:
        count *= d
    return b"\x93NUMPY" + bytes([version, 0]) + size + header + b"\x01" * (count * int(descr[2:]))


def pickle_bytes(protocol: int = 4) -> bytes:
    data = pickle.dumps({"rng": [i for i in range(300) if i != 0x2E], "note": "x" * 200}, protocol=protocol)
    # Protocols 2 and 3 are judged by their STOP byte alone: one cut right after a 0x2e inside would read as whole.
    assert protocol >= 4 or data.index(b".") == len(data) - 1
    return data


def json_bytes() -> bytes:
    return json.dumps({"step": 7, "history": [{"loss": 1.5}] * 40}).encode()


TORCH_SMALL, SAFE_SMALL = torch_bytes(0, 64), safetensors_bytes({"a": 8, "b": 16})
NPY, PICKLE, JSON = npy_bytes(), pickle_bytes(), json_bytes()
FOLDER_FILES = {"model.pt": TORCH_SMALL, "weights.safetensors": SAFE_SMALL, "meta.json": JSON, "rng.pkl": PICKLE, "stats.npy": NPY}


@settings(max_examples=60, deadline=None)
@given(st.sampled_from(sorted(FOLDER_FILES) + ["v2.npy", "p2.pkl", "p5.pkl"]), st.data())
def test_each_files_format_says_whether_it_is_whole_wherever_it_is_cut(name, data):
    whole = {"v2.npy": npy_bytes((2, 3, 4), "<i8", 2), "p2.pkl": pickle_bytes(2), "p5.pkl": pickle_bytes(5)}.get(
        name, FOLDER_FILES.get(name)
    )
    assert whole is not None
    cut = data.draw(st.integers(1 if name.endswith(".pt") else 0, len(whole) - 1))  # an empty .pt has no bytes to say it is a zip
    assert judge_file(name, folder_probe(name, whole)).state == "complete", judge_file(name, folder_probe(name, whole))
    assert judge_file(name, folder_probe(name, whole[:cut])).state == "cut", (name, cut)


def test_a_legacy_torch_save_and_a_pickle_of_an_old_protocol_are_of_unknown_format_not_cut():
    import torch

    buf = io.BytesIO()
    torch.save({"w": torch.zeros(4)}, buf, _use_new_zipfile_serialization=False)
    legacy = buf.getvalue()
    assert judge_file("model.pkl", folder_probe("model.pkl", legacy)).state == "unknown"
    assert judge_file("old.pkl", folder_probe("old.pkl", pickle.dumps([1, 2], protocol=0))).state == "unknown"


# ---------------------------------------------------------------------------------------------
# The probes the host takes, modelled for the pure property (checked against the real host below)

PROBED = 8  # list_checkpoints.sh's PROBE


def _head(name: str, data: bytes, length: int = 64) -> bytes:
    if name.endswith(".safetensors") and len(data) >= 8:
        length = 8 + struct.unpack_from("<Q", data)[0]
    return data[: 4096 if name.endswith(".npy") else length]


def folder_probe(rel: str, data: bytes) -> Probe:
    """A file inside a folder as list_checkpoints.sh reads it: JSON whole, others' head and a 4 KiB tail."""
    if rel.endswith(".json"):
        return Probe(size=len(data), head=data, tail=b"")
    return Probe(size=len(data), head=_head(rel, data), tail=data[-4096:] if data else b"")


def file_probe(name: str, data: bytes) -> Probe:
    return Probe(size=len(data), head=_head(name, data), tail=data[-65633:] if data else b"")


def test_the_host_reads_a_folders_npy_pickle_and_json_files_as_the_property_models_them(target):
    ckpt = Path(target.checkpoint_dir)
    for rel, data in FOLDER_FILES.items():
        put(ckpt / "step_10" / rel, data)
    put(ckpt / "step_20.safetensors", SAFE_SMALL)
    found = read_listing(listed(target)).probes
    assert found["step_10"].files == {rel: folder_probe(rel, data) for rel, data in FOLDER_FILES.items()}
    assert found["step_20.safetensors"].files == {"": file_probe("step_20.safetensors", SAFE_SMALL)}


# ---------------------------------------------------------------------------------------------
# Real files, the run's records where the host keeps them


def put(path: Path, data: bytes, mtime: float | None = None) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    if mtime is not None:
        os.utime(path, (mtime, mtime))
    return path


def folder(path: Path, files: dict[str, bytes], mtime: float) -> None:
    for i, (rel, data) in enumerate(files.items()):
        put(path / rel, data, mtime + 0.01 * i)
    os.utime(path, (mtime, mtime))


def record_run(target: Target, started: float, *, resumed: str | None = None, command: str | None = None, died: float | None = None):
    """The current run as launch.sh records it (RUN/checkpoint: the path it resumed from, or empty), or as adopt.sh
    does (RUN/adopted, RUN/command); `died`: a SIGKILL from outside then (RUN/exit_code 137, its mtime)."""
    run = Path(runlayout.run_folder(target.state_path, "run-1"))
    run.mkdir(parents=True)
    Path(runlayout.current_file(target.state_path)).write_text("run-1\n")
    (run / "started_at").write_text(f"{started:.6f}\n")
    if command is not None:
        (run / "adopted").write_text("by hand\n")
        (run / "command").write_text(command + "\n")
        (run / "checkpoint").write_text("")
    else:
        (run / "checkpoint").write_text(f"{target.checkpoint_dir}/{resumed}\n" if resumed else "\n")
    if died is not None:
        put(run / "exit_code", b"137\n", died)


def chosen(target: Target) -> Choice:
    return pick_checkpoint(target, listed(target))


def skip_of(choice: Choice, name: str) -> Reason | None:
    return next((s.reason for s in choice.skips if s.name == name), None)


# ---------------------------------------------------------------------------------------------
# The run's own order


def test_a_loop_whose_step_starts_again_each_epoch_resumes_from_the_last_epochs_newest_save(target):
    ckpt, at = Path(target.checkpoint_dir), 1_000_000.0
    names = [f"epoch_3_step_{s}.pt" for s in (10, 20, 30)] + [f"epoch_4_step_{s}.pt" for s in (10, 20)]
    for i, name in enumerate(names):
        put(ckpt / name, torch_bytes(i, 64), at + 60 * i)
    record_run(target, at - 10, resumed="", died=at + 60 * 4 + 5)
    choice = chosen(target)
    assert (choice.name, choice.step) == ("epoch_4_step_20.pt", 20), describe(choice)
    assert not choice.skipped, describe(choice)


def test_a_later_stage_is_newer_than_an_earlier_stages_higher_step(target):
    ckpt, at = Path(target.checkpoint_dir), 1_000_000.0
    put(ckpt / "stage1_step_5000.pt", torch_bytes(1, 64), at)
    put(ckpt / "stage2_step_100.pt", torch_bytes(2, 64), at + 600)
    choice = chosen(target)
    assert choice.name == "stage2_step_100.pt" and "(2, 100" in choice.why, describe(choice)


def test_a_second_stage_counting_from_zero_in_the_same_names_resumes_from_its_own_newest_save(target):
    ckpt, at = Path(target.checkpoint_dir), 1_000_000.0
    for i, step in enumerate(range(1000, 5001, 1000)):
        put(ckpt / f"step_{step}.pt", torch_bytes(i, 64), at - HOUR + 60 * i)
    record_run(target, at, resumed="step_5000.pt", died=at + 400)
    put(ckpt / "step_100.pt", torch_bytes(10, 64), at + 100)
    put(ckpt / "step_200.pt", torch_bytes(11, 64), at + 200)
    choice = chosen(target)
    assert (choice.name, choice.step) == ("step_200.pt", 200), describe(choice)
    assert "step order and write order disagree: step_5000.pt is higher in step order" in choice.why, describe(choice)
    assert skip_of(choice, "step_5000.pt") is Reason.EARLIER_TRAJECTORY, choice.skips


def test_within_one_run_a_counter_that_started_again_is_followed_by_write_time(target):
    ckpt, at = Path(target.checkpoint_dir), 1_000_000.0
    record_run(target, at - 10, resumed="", died=at + 1000)
    for i, step in enumerate((1000, 2000, 3000, 100, 200)):  # one process: stage 2 counts from 0 in the same names
        put(ckpt / f"step_{step}.pt", torch_bytes(i, 64), at + 100 * i)
    choice = chosen(target)
    assert choice.name == "step_200.pt", describe(choice)
    assert skip_of(choice, "step_3000.pt") is Reason.COUNTER_RESET and "its counter started again" in describe(choice), choice.skips


def rolled_back(target: Target, at: float, new: tuple[int, ...] = (420, 440, 460)) -> None:
    """step_100 .. step_800 of a branch abandoned 3 h ago; the new trajectory's saves from step_400 on."""
    ckpt = Path(target.checkpoint_dir)
    for i, step in enumerate(range(100, 801, 100)):
        put(ckpt / f"step_{step}.pt", torch_bytes(i, 64), at - 3 * HOUR + 60 * i)
    for i, step in enumerate(new):
        put(ckpt / f"step_{step}.pt", torch_bytes(20 + i, 64), at + 60 * (i + 1))


@pytest.mark.parametrize("how", ["resumed_by_relaunch", "adopted_with_its_command_line"])
def test_a_persons_rollback_is_followed_and_the_abandoned_branchs_higher_step_never_wins(target, how):
    at = 1_000_000.0
    rolled_back(target, at)
    if how == "resumed_by_relaunch":
        record_run(target, at, resumed="step_400.pt", died=at + 300)
    else:
        record_run(target, at, command=f"python train.py --resume {target.checkpoint_dir}/step_400.pt", died=at + 300)
    choice = chosen(target)
    assert (choice.name, choice.step) == ("step_460.pt", 460), describe(choice)
    assert skip_of(choice, "step_800.pt") is Reason.ABANDONED_BRANCH, choice.skips
    assert "of a branch the current run left: written before it began, above step_400.pt" in describe(choice)


def test_a_run_that_resumed_from_the_new_trajectory_and_saved_nothing_resumes_from_it_again(target):
    at = 1_000_000.0
    rolled_back(target, at)
    record_run(target, at + 500, resumed="step_460.pt", died=at + 530)
    choice = chosen(target)
    assert choice.name == "step_460.pt" and "the checkpoint the current run resumed from" in choice.why, describe(choice)
    assert skip_of(choice, "step_800.pt") is Reason.ABANDONED_BRANCH


def test_a_run_sent_back_to_the_first_stages_end_that_saved_nothing_yet_resumes_from_there_again(target):
    """Stage 2 counted from 0 in the same names (step_100, step_200, after step_5000); a person judged it bad and sent
    the run back to step_5000, and it died before saving: step_5000, not stage 2's newer step_200, and nobody asked."""
    ckpt, at = Path(target.checkpoint_dir), 1_000_000.0
    for i, step in enumerate((4000, 5000)):
        put(ckpt / f"step_{step}.pt", torch_bytes(i, 64), at - 2 * HOUR + 60 * i)
    for i, step in enumerate((100, 200)):
        put(ckpt / f"step_{step}.pt", torch_bytes(10 + i, 64), at - HOUR + 60 * i)
    record_run(target, at, resumed="step_5000.pt", died=at + 30)
    choice = chosen(target)
    assert choice.name == "step_5000.pt" and "the checkpoint the current run resumed from" in choice.why, describe(choice)
    assert skip_of(choice, "step_200.pt") is Reason.EARLIER_TRAJECTORY, choice.skips


def test_where_write_order_and_step_order_disagree_and_nothing_says_which_trajectory_a_person_is_asked(target):
    rolled_back(target, 1_000_000.0)  # no record of the current run: a target relaunch never launched
    with pytest.raises(CheckpointUnusable) as raised:
        chosen(target)
    text = str(raised.value)
    assert "step order and write order disagree: step_800.pt is highest in step order, step_460.pt was written 2.9 h after it" in text
    assert "relaunch cannot tell which trajectory the run is on" in text and "move the saves of the trajectory" in text, text


def test_a_run_begun_from_scratch_never_resumes_a_save_written_before_it(target):
    ckpt, at = Path(target.checkpoint_dir), 1_000_000.0
    put(ckpt / "step_100.pt", torch_bytes(1, 64), at - HOUR)
    put(ckpt / "step_200.pt", torch_bytes(2, 64), at - HOUR + 60)
    record_run(target, at, resumed="", died=at + 100)
    put(ckpt / "step_10.pt", torch_bytes(3, 64), at + 50)
    choice = chosen(target)
    assert choice.name == "step_10.pt" and skip_of(choice, "step_200.pt") is Reason.ABANDONED_BRANCH, describe(choice)


# ---------------------------------------------------------------------------------------------
# A folder of no known layout, by its content


def test_a_complete_folder_of_no_known_layout_renamed_in_just_before_a_sigkill_is_taken(target):
    ckpt, at = Path(target.checkpoint_dir), 1_000_000.0
    files = {"state.pt": TORCH_SMALL, "meta.json": JSON}
    folder(ckpt / "step_100", files, at)
    folder(ckpt / ".step_200.tmp", files, at + 60)
    (ckpt / ".step_200.tmp").rename(ckpt / "step_200")  # saved aside, renamed in whole
    record_run(target, at - 10, resumed="", died=at + 60.5)
    choice = chosen(target)
    assert choice.name == "step_200" and "complete" in (choice.content or ""), describe(choice)
    assert not choice.skipped, describe(choice)


def test_the_only_checkpoint_a_folder_of_whole_files_finished_just_before_a_sigkill_is_taken(target):
    ckpt, at = Path(target.checkpoint_dir), 1_000_000.0
    folder(ckpt / "step_50", {"state.pt": TORCH_SMALL}, at)
    record_run(target, at - 10, resumed="", died=at + 0.6)
    choice = chosen(target)
    assert choice.name == "step_50", describe(choice)


@pytest.mark.parametrize("unfinished", ["file_not_begun", "raw_file_shorter_than_before"])
def test_a_folder_still_being_written_is_never_taken_whatever_was_written_after_it(target, unfinished):
    """Its model.pt whole, its optimizer state not (not begun, or a raw file still growing), and a small marker written
    last beside it: the death's window holds the marker, not the folder; the folder's files say it is cut."""
    ckpt, at = Path(target.checkpoint_dir), 1_000_000.0
    folder(ckpt / "step_100", {"model.pt": TORCH_SMALL, "optim.bin": b"\x07" * 5000}, at)
    folder(
        ckpt / "step_200",
        {"model.pt": torch_bytes(5, 64)} | ({"optim.bin": b"\x07" * 1200} if unfinished != "file_not_begun" else {}),
        at + 60,
    )
    put(ckpt / "step_200.in_progress", b"1\n", at + 60.2)
    record_run(target, at - 10, resumed="", died=at + 60.4)
    choice = chosen(target)
    assert choice.name == "step_100", describe(choice)
    says = (
        "it lacks optim.bin, which step_100 holds"
        if unfinished == "file_not_begun"
        else "its optim.bin is 1200 bytes where step_100's was 5000"
    )
    assert skip_of(choice, "step_200") is Reason.CUT and says in describe(choice), describe(choice)


def test_the_listing_says_what_the_current_run_resumed_from_and_an_adopted_runs_command_line(target):
    record_run(target, 5.0, resumed="step_40.pt")
    assert read_listing(listed(target)).run.resumed_from == "step_40.pt"
    (Path(runlayout.run_folder(target.state_path, "run-1")) / "checkpoint").write_text("\n")
    assert read_listing(listed(target)).run.resumed_from == ""
    run = Path(runlayout.run_folder(target.state_path, "run-1"))
    (run / "adopted").write_text("by hand\n")
    (run / "command").write_text("python train.py --resume /x/step_40.pt\n")
    facts = read_listing(listed(target)).run
    assert (facts.resumed_from, facts.command) == (None, "python train.py --resume /x/step_40.pt")


# ---------------------------------------------------------------------------------------------
# The property: generated histories of runs


@dataclass
class Save:
    name: str
    counter: tuple[int, int, int]  # stage, epoch, step
    files: dict[str, bytes]  # "" for a single file
    first: float
    written: float
    whole: bool
    parent: Save | None = field(default=None, repr=False)


@dataclass
class Run:
    started: float
    resumed: Save | None
    saves: list[Save] = field(default_factory=list)


SCHEMES = {
    "flat": "step_{s}",
    "epoch": "epoch_{e}_step_{s}",  # the step starts again each epoch
    "stage": "stage{g}_step_{s}",  # ... and each stage
    "restage": "step_{s}",  # a second stage counting from 0 in the same names
}
LAYOUTS = {"torch": ".pt", "safetensors": ".safetensors", "folder": ""}
# How the current run's records stand: launched by relaunch, adopted with a command line naming its checkpoint, adopted
# naming none, or none recorded at all.
LEVELS = ("launched", "adopted_named", "adopted", "unrecorded")


def _advance(scheme: str, counter: tuple[int, int, int], data) -> tuple[int, int, int]:
    stage, epoch, step = counter
    if scheme != "flat" and step and data.draw(st.integers(0, 3)) == 0:
        return (stage + 1, epoch, 10) if scheme in ("stage", "restage") else (stage, epoch + 1, 10)
    return stage, epoch, step + 10


def _cut(files: dict[str, bytes], data) -> dict[str, bytes]:
    """A save the death interrupted: its files written in some order, one cut (or not begun), the rest not begun."""
    order = data.draw(st.permutations(sorted(files)))
    at = data.draw(st.integers(0, len(order) - 1))
    cut = {rel: files[rel] for rel in order[:at]}
    if data.draw(st.booleans()):
        rel = order[at]
        cut[rel] = files[rel][: data.draw(st.integers(0, len(files[rel]) - 1))]
    return cut


@st.composite
def histories(draw):
    scheme, layout, level = draw(st.sampled_from(sorted(SCHEMES))), draw(st.sampled_from(sorted(LAYOUTS))), draw(st.sampled_from(LEVELS))
    if layout == "folder":
        chosen_files = draw(st.lists(st.sampled_from(sorted(FOLDER_FILES)), min_size=1, max_size=5, unique=True))
        content = {rel: FOLDER_FILES[rel] for rel in chosen_files}
    else:
        content = {"": TORCH_SMALL if layout == "torch" else SAFE_SMALL}
    folder_state: dict[str, Save] = {}
    runs: list[Run] = []
    clock = 1_000_000.0
    n_runs = draw(st.integers(1, 4))
    sufficient = level in ("launched", "adopted_named")
    for j in range(n_runs):
        current = j == n_runs - 1
        resumed, counter = None, (1, 1, 0)
        if runs:
            trajectory = [s for s in _trajectory(runs[-1], folder_state) if s.whole]
            pick = 0
            if trajectory and (sufficient or not current) and draw(st.booleans()):
                pick = draw(st.integers(0, len(trajectory) - 1))  # a person's rollback
            if trajectory:
                resumed, counter = trajectory[pick], trajectory[pick].counter
            rolled = pick > 0
        else:
            rolled = False
        clock += draw(st.floats(5, 3 * HOUR))
        run = Run(started=clock, resumed=resumed)
        n = draw(st.integers(1 if j == 0 else 0, 4))
        # A rollback that left no whole save, before the current run, leaves no evidence relaunch could read.
        must_finish = rolled and not current and not sufficient
        n = max(n, 1) if must_finish else n
        parent = resumed
        for i in range(n):
            counter = _advance(scheme, counter, _Draw(draw))
            name = SCHEMES[scheme].format(g=counter[0], e=counter[1], s=counter[2]) + LAYOUTS[layout]
            last = i == n - 1
            # The limit the docs state: a folder lacking a file, with no whole earlier save read beside it (the host reads
            # the 8 newest) to compare with, reads as whole.
            others = sorted((s for other, s in folder_state.items() if other != name), key=lambda s: -s.written)[: PROBED - 1]
            comparable = layout != "folder" or any(s.whole for s in others)
            whole = not (last and not must_finish and comparable and draw(st.booleans()))
            files = content if whole else _cut(content, _Draw(draw))
            files = files if files or layout == "folder" else {"": b""}  # a file is created before it is written
            first = clock + draw(st.floats(1, 600))
            written = first + (0.01 * len(files) if layout == "folder" else 0.0)
            clock = written
            save = Save(name=name, counter=counter, files=files, first=first, written=written, whole=whole, parent=parent)
            run.saves.append(save)
            folder_state[name] = save
            parent = save
        runs.append(run)
    died = clock + draw(st.floats(0.0, 30.0))
    how = draw(st.sampled_from([137, 143, 1, None]))
    return layout, level, runs, folder_state, died, how


class _Draw:
    """`data.draw` over a composite's `draw`."""

    def __init__(self, draw):
        self.draw = draw


def _trajectory(run: Run, state: dict[str, Save]) -> list[Save]:
    """The saves of a run's own trajectory still in the folder, newest first: its own, then back through what it resumed from."""
    out, at = [], run.saves[-1] if run.saves else run.resumed
    while at is not None:
        if state.get(at.name) is at:
            out.append(at)
        at = at.parent
    return out


def _listing(layout: str, level: str, runs: list[Run], state: dict[str, Save], died: float, how: int | None):
    entries, probes = [], {}
    for name, s in state.items():
        empty = not s.files or (layout != "folder" and not s.files[""])
        entries.append(
            Entry(
                name=name,
                kind="d" if layout == "folder" else "f",
                mtime=s.first,
                empty=empty,
                newest=s.written if layout == "folder" else None,
            )
        )
    for e in sorted(entries, key=lambda e: -e.written)[:PROBED]:
        s = state[e.name]
        files = {rel: folder_probe(rel, d) for rel, d in s.files.items()} if layout == "folder" else {"": file_probe(e.name, s.files[""])}
        probes[e.name] = EntryProbe(files=files)
    run = runs[-1]
    facts = RunFacts(started_at=run.started, exit_code=how, exit_at=died if how is not None else None)
    if level == "launched":
        facts.resumed_from = run.resumed.name if run.resumed else ""
    elif level == "adopted_named" and run.resumed is not None:
        facts.command = f"python train.py --resume /ckpt/{run.resumed.name} --steps 100"
    elif level == "unrecorded":
        facts = RunFacts()
    return entries, probes, facts


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(histories())
def test_the_choice_is_the_newest_complete_save_of_the_runs_own_trajectory_or_an_escalation_that_says_why(history):
    layout, level, runs, state, died, how = history
    entries, probes, facts = _listing(layout, level, runs, state, died, how)
    choice = choose(entries, run=facts, probes=probes)
    mine = [s for s in _trajectory(runs[-1], state) if s.whole]
    expected = mine[0].name if mine else None
    current = runs[-1]
    resumed_here = current.resumed is not None and state.get(current.resumed.name) is current.resumed
    evident = (level == "launched" or (level == "adopted_named" and current.resumed is not None)) and (
        any(s.whole and state.get(s.name) is s for s in current.saves) or resumed_here or current.resumed is None
    )
    if choice.escalate:
        assert choice.name is None and choice.escalate.strip(), choice
        assert not evident or expected is None, (expected, describe(choice))
        return
    assert choice.name == expected, (level, expected, describe(choice))
    if choice.name is None:
        return
    at = state[choice.name]
    for name, s in state.items():
        newer = s.written > at.written + 0.1 or _order(s) > _order(at)
        if s.whole and name != choice.name and newer:
            assert any(k.name == name for k in choice.skips), (name, describe(choice))


def _order(s: Save) -> tuple[int, ...]:
    from relaunch.deciding.checkpoint_names import order_of

    return order_of(s.name) or ()
