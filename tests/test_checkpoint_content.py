"""Checkpoints judged by their content: a real torch.save zip, safetensors, a DCP folder, a Hugging Face Trainer
folder, Lightning's `last.ckpt`, each whole or cut (by truncation at any offset, and by a real SIGKILL mid-save),
listed by the real host script (`relaunch/host/list_checkpoints.sh`, which only gathers bytes) and chosen in Python.

The property (Hypothesis, over layouts, cut points and mtimes around a death): the choice is always the newest
complete checkpoint; a cut one is never chosen, whoever killed the run and whenever; a complete one of a known format
is never skipped for timing.
"""

from __future__ import annotations

import io
import json
import os
import signal
import struct
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from relaunch.config import Target
from relaunch.deciding.checkpoints import Entry, EntryProbe, Probe, RunFacts, choose, judge_file, not_a_step, step_of
from relaunch.plans.checkpoint_listing import read_listing
from relaunch.tasks.launch import describe, pick_checkpoint
from relaunch.testing.faults import wait_for
from tests.test_checkpoint_choice import base, listed, target  # noqa: F401 - the shared target fixtures and the host listing

# ---------------------------------------------------------------------------------------------
# Real bytes


def torch_bytes(seed: int = 0, numel: int = 40_000) -> bytes:
    """A real torch.save (its default zip format) of a small state dict: ~160 KiB, bigger than the tail the host reads."""
    g = torch.Generator().manual_seed(seed)
    buf = io.BytesIO()
    torch.save({"w": torch.randn(numel, generator=g), "step": seed}, buf)
    return buf.getvalue()


def safetensors_bytes(tensors: dict[str, int] | None = None) -> bytes:
    """A safetensors file written from its spec: u64 little-endian header length, JSON header, raw data."""
    tensors = tensors or {"a": 64, "b": 4096}
    header, data, at = {"__metadata__": {"format": "pt"}}, b"", 0
    for name, numel in tensors.items():
        header[name] = {"dtype": "F32", "shape": [numel], "data_offsets": [at, at + 4 * numel]}
        data += struct.pack(f"<{numel}f", *range(numel))
        at += 4 * numel
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)  # the spec pads the header to 8 bytes with spaces
    return struct.pack("<Q", len(text)) + text + data


TORCH = torch_bytes()
SAFE = safetensors_bytes()


def pick(target: Target):
    return pick_checkpoint(target, listed(target))


def put(path: Path, data: bytes, mtime: float | None = None) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    if mtime is not None:
        os.utime(path, (mtime, mtime))
    return path


def died(ckpt: Path, name: str, after: float, code: int | None = 137) -> RunFacts:
    """A run that died `after` seconds after NAME's last write: by `code` (None: an adopted run, no exit code)."""
    written = (ckpt / name).stat().st_mtime
    return RunFacts(started_at=written - 100, exit_code=code, exit_at=written + after if code is not None else None)


def choose_listed(target: Target, run: RunFacts | None = None, **kw):
    found = read_listing(listed(target))
    return choose(found.entries, links=found.links, contents=found.contents, run=run or found.run, probes=found.probes, **kw)


# ---------------------------------------------------------------------------------------------
# The reproduced failures


def test_a_symlinked_checkpoint_dir_is_followed_and_its_newest_checkpoint_resumed(target, tmp_path):
    real = tmp_path / "real"
    put(real / "step_10.pt", TORCH, 1000.0)
    put(real / "step_20.pt", torch_bytes(1), 1010.0)
    Path(target.checkpoint_dir).rmdir()
    Path(target.checkpoint_dir).symlink_to(real)
    choice = pick(target)
    assert (choice.name, choice.step) == ("step_20.pt", 20), describe(choice)
    assert "torch zip (torch.save): complete" in choice.why


@pytest.mark.parametrize(
    ("after", "code"),
    [(2.6, 137), (0.1, 137), (30.0, 1), (5.0, None), (0.5, 0)],
    ids=["sigkill_2_6_s_later", "sigkill_at_once", "a_rank_died_exit_1", "adopted_no_exit_code", "exited_cleanly"],
)
def test_a_torch_save_cut_short_is_skipped_whoever_killed_the_run_and_whenever(target, after, code):
    ckpt = Path(target.checkpoint_dir)
    put(ckpt / "step_100.pt", TORCH, 1000.0)
    put(ckpt / "step_200.pt", TORCH[: len(TORCH) * 2 // 3], 1100.0)
    choice = choose_listed(target, died(ckpt, "step_200.pt", after, code))
    assert choice.name == "step_100.pt", describe(choice)
    assert any(s.startswith("'step_200.pt': torch zip (torch.save): cut short") for s in choice.skipped), choice.skipped


def test_a_finished_checkpoint_renamed_in_just_before_a_sigkill_is_taken_not_judged_by_time(target):
    ckpt = Path(target.checkpoint_dir)
    put(ckpt / "step_100.pt", TORCH, 1000.0)
    put(ckpt / ".step_200.pt.tmp", TORCH, 1100.0)
    (ckpt / ".step_200.pt.tmp").rename(ckpt / "step_200.pt")  # saved aside, renamed in: whole
    choice = choose_listed(target, died(ckpt, "step_200.pt", 0.2))
    assert (choice.name, choice.step) == ("step_200.pt", 200), describe(choice)
    assert choice.skipped == [], choice.skipped


def test_a_save_of_unknown_format_is_still_judged_by_time_and_the_reasons_say_so(target):
    ckpt = Path(target.checkpoint_dir)
    put(ckpt / "step_100.bin", b"\x80\x02legacy pickle" * 100, 1000.0)
    put(ckpt / "step_200.bin", b"\x80\x02legacy pickle" * 100, 1100.0)
    choice = choose_listed(target, died(ckpt, "step_200.bin", 0.5))
    assert choice.name == "step_100.bin", describe(choice)
    assert "format unknown (neither a zip (torch.save) nor safetensors): judged by time" in choice.skipped[0], choice.skipped
    assert "format unknown" in (choice.content or "") and "judged by time" in choice.why


def test_lightnings_last_ckpt_is_the_newest_save_when_whole_and_the_top_k_file_when_it_is_cut(target):
    ckpt = Path(target.checkpoint_dir)
    put(ckpt / "epoch=2-step=600.ckpt", TORCH, 1000.0)
    put(ckpt / "epoch=3-step=900.ckpt", TORCH, 1100.0)
    put(ckpt / "last.ckpt", torch_bytes(2), 1101.0)
    choice = pick(target)
    assert (choice.name, choice.step) == ("last.ckpt", None), describe(choice)
    assert "Lightning's last.ckpt, the newest save by definition; torch zip (torch.save): complete" in choice.why
    put(ckpt / "last.ckpt", torch_bytes(2)[:5000], 1200.0)
    choice = pick(target)
    assert (choice.name, choice.step) == ("epoch=3-step=900.ckpt", 900), describe(choice)
    assert any(s.startswith("'last.ckpt': torch zip (torch.save): cut short") for s in choice.skipped)


@pytest.mark.parametrize(
    "name", ["run-20261201", "run-2026-12-01", "run-20261201-1530", "20261201", "model_v3.pt", "last-v2", "lr0.001.pt"]
)
def test_a_name_whose_number_only_looks_like_a_step_is_no_step(name):
    assert step_of(name) is None and not_a_step(name), name
    choice = choose([Entry(name="step_600", kind="d", mtime=1.0), Entry(name=name, kind="d", mtime=2.0)])
    assert choice.name == "step_600", choice


@pytest.mark.parametrize(("name", "step"), [("checkpoint-20261201", 20261201), ("step_000900", 900), ("epoch=3-step=900.ckpt", 900)])
def test_a_step_word_makes_any_number_a_step(name, step):
    assert step_of(name) == step


# ---------------------------------------------------------------------------------------------
# Each format, whole and cut


@settings(max_examples=200, deadline=None)
@given(st.integers(min_value=0, max_value=len(TORCH) - 1), st.integers(min_value=0, max_value=len(SAFE) - 1))
def test_a_torch_save_or_safetensors_cut_at_any_offset_is_cut_and_whole_is_complete(torch_at, safe_at):
    def probe(data: bytes, tail: int = 65633) -> Probe:
        return Probe(size=len(data), head=data[: 8 + struct.unpack_from("<Q", data)[0]] if len(data) >= 8 else data, tail=data[-tail:])

    assert judge_file("step_1.pt", probe(TORCH)).state == "complete"
    assert judge_file("m.safetensors", probe(SAFE)).state == "complete"
    if torch_at:
        assert judge_file("step_1.pt", probe(TORCH[:torch_at])).state == "cut", torch_at
    if safe_at:
        assert judge_file("m.safetensors", probe(SAFE[:safe_at])).state == "cut", safe_at


def test_a_zip64_torch_save_and_a_zip_with_a_long_comment_are_complete_and_garbage_after_the_end_is_not():
    import zipfile

    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", allowZip64=True) as z:
        z.writestr("archive/data.pkl", b"x" * 100)
        z.comment = b"c" * 60000
    data = buf.getvalue()
    assert judge_file("a.pt", Probe(size=len(data), head=data[:64], tail=data[-65633:])).state == "complete"
    assert TORCH.rfind(b"PK\x06\x06") > 0, "torch.save writes zip64 end records"
    extra = TORCH + b"\0" * 10
    assert judge_file("a.pt", Probe(size=len(extra), head=extra[:64], tail=extra[-65633:])).state == "cut"


def test_a_safetensors_file_whose_header_does_not_parse_or_describes_less_is_never_taken():
    bad = struct.pack("<Q", 8) + b"{not js}" + b"x" * 16
    assert judge_file("m.safetensors", Probe(size=len(bad), head=bad, tail=bad)).detail.startswith("damaged")
    longer = SAFE + b"x"
    assert judge_file("m.safetensors", Probe(size=len(longer), head=longer, tail=b"")).state == "cut"


# One process, no process group: DCP's gloo path gathers its plan through numpy, which the venv lacks.
DCP_SAVE = """
import sys, torch, torch.distributed.checkpoint as dcp
for path in sys.argv[1].split(","):
    dcp.save({"w": torch.randn(200, 200), "b": torch.zeros(7)}, checkpoint_id=path)
"""


def test_a_dcp_folder_saved_by_torch_is_complete_and_one_without_its_metadata_is_cut(target, tmp_path):
    ckpt = Path(target.checkpoint_dir)
    paths = [ckpt / "step_100", ckpt / "step_200"]
    subprocess.run([sys.executable, "-c", DCP_SAVE, ",".join(map(str, paths))], check=True, timeout=120)
    assert (paths[1] / ".metadata").exists() and list(paths[1].glob("__*_*.distcp"))
    choice = pick(target)
    assert choice.name == "step_200" and "DCP folder (torch.distributed.checkpoint): complete" in choice.why, describe(choice)
    (paths[1] / ".metadata").rename(tmp_path / "metadata-aside")  # as it is before its last write
    choice = choose_listed(target, RunFacts(started_at=1.0, exit_code=1, exit_at=1e10))
    assert choice.name == "step_100", describe(choice)
    assert any("'step_200': DCP folder (torch.distributed.checkpoint): cut short" in s for s in choice.skipped), choice.skipped


def hf_folder(folder: Path, *, shards: int = 2) -> None:
    names = [f"model-{i + 1:05d}-of-{shards:05d}.safetensors" for i in range(shards)]
    for i, name in enumerate(names):
        put(folder / name, safetensors_bytes({f"layer{i}.w": 256}))
    index = {"metadata": {"total_size": 1024 * shards}, "weight_map": {f"layer{i}.w": n for i, n in enumerate(names)}}
    put(folder / "model.safetensors.index.json", json.dumps(index).encode())
    put(folder / "optimizer.pt", torch_bytes(3, 2000))
    put(folder / "trainer_state.json", json.dumps({"global_step": 1, "log_history": [{"loss": 1.0}] * 50}).encode())


@pytest.mark.parametrize(
    ("damage", "says"),
    [
        ("trainer_state", "trainer_state.json does not parse"),
        ("shard_missing", "named by model.safetensors.index.json, is missing"),
        ("shard_cut", "model-00002-of-00002.safetensors is (cut short"),
        ("optimizer_cut", "optimizer.pt is (cut short"),
    ],
)
def test_a_hugging_face_trainer_folder_is_taken_whole_and_skipped_when_any_part_is_cut(target, damage, says):
    ckpt = Path(target.checkpoint_dir)
    hf_folder(ckpt / "checkpoint-300")
    hf_folder(ckpt / "checkpoint-600")
    whole = pick(target)
    assert whole.name == "checkpoint-600" and "Hugging Face Trainer folder: complete" in whole.why, describe(whole)
    last = ckpt / "checkpoint-600"
    if damage == "trainer_state":
        put(last / "trainer_state.json", (last / "trainer_state.json").read_bytes()[:-20])
    elif damage == "shard_missing":
        (last / "model-00002-of-00002.safetensors").unlink()
    elif damage == "shard_cut":
        put(last / "model-00002-of-00002.safetensors", (last / "model-00002-of-00002.safetensors").read_bytes()[:-100])
    else:
        put(last / "optimizer.pt", (last / "optimizer.pt").read_bytes()[:-30])
    choice = choose_listed(target, RunFacts())  # an adopted run: nothing known of how it ended
    assert choice.name == "checkpoint-300", describe(choice)
    assert any(s.startswith("'checkpoint-600': Hugging Face Trainer folder: cut short") and says in s for s in choice.skipped), (
        choice.skipped
    )


# ---------------------------------------------------------------------------------------------
# A real SIGKILL mid-save

WRITER = """
import sys, torch
torch.manual_seed(0)
state = {"w": torch.randn(4_000_000)}  # 16 MB a save
i = 0
while True:
    i += 1
    torch.save(state, f"{sys.argv[1]}/step_{i}.pt")
"""


def loads(path: Path) -> bool:
    try:
        torch.load(path, weights_only=True)
    except Exception:  # noqa: BLE001 - any failure to load is a cut save
        return False
    return True


@pytest.mark.parametrize("fraction", [0.13, 0.5, 0.77, 0.97])
def test_a_torch_save_really_sigkilled_mid_write_is_never_chosen_and_the_newest_whole_one_is(target, fraction):
    """A process saving 16 MB in a loop, SIGKILLed once its newest save has grown past a fraction of a save: the
    choice is the newest file torch.load takes, whatever the exit code and the time between the write and the death."""
    ckpt = Path(target.checkpoint_dir)
    writer = subprocess.Popen([sys.executable, "-c", WRITER, str(ckpt)], stderr=subprocess.DEVNULL)
    full = 16_000_000 * fraction

    def grown() -> bool:
        saves = sorted(ckpt.glob("step_*.pt"), key=lambda p: step_of(p.name) or 0)
        return len(saves) >= 3 and saves[-1].stat().st_size >= full

    try:
        wait_for(grown, 120, "the writer's third save to grow", interval=0.0005)
    finally:
        writer.send_signal(signal.SIGKILL)
        writer.wait()
    whole = [p.name for p in ckpt.glob("step_*.pt") if loads(p)]
    newest_whole = max(whole, key=lambda n: step_of(n) or 0)
    newest = max(ckpt.glob("step_*.pt"), key=lambda p: step_of(p.name) or 0).name
    for after, code in ((2.6, 137), (0.0, 137), (3.0, 1), (0.0, None)):
        choice = choose_listed(target, died(ckpt, newest, after, code))
        assert choice.name == newest_whole, (after, code, describe(choice))


# ---------------------------------------------------------------------------------------------
# The property


FORMATS = ("torch", "safetensors")


@st.composite
def layouts(draw):
    """Up to 5 checkpoints of rising step and mtime, each of a known format, whole or cut at some offset; the run
    died (or a stop killed it, or it was adopted) some seconds after the newest write."""
    n = draw(st.integers(min_value=1, max_value=5))
    saves = []
    for i in range(n):
        fmt = draw(st.sampled_from(FORMATS))
        data = TORCH if fmt == "torch" else SAFE
        cut = draw(st.one_of(st.none(), st.integers(min_value=1, max_value=len(data) - 1)))
        saves.append((f"step_{(i + 1) * 100}" + (".pt" if fmt == "torch" else ".safetensors"), data if cut is None else data[:cut]))
    gaps = draw(st.lists(st.floats(min_value=0.05, max_value=30.0), min_size=n, max_size=n))
    after = draw(st.floats(min_value=-0.5, max_value=10.0))
    how = draw(st.sampled_from(["sigkill", "sigterm", "exit_1", "adopted", "stop_killed"]))
    return saves, gaps, after, how


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(layout=layouts())
def test_the_choice_is_always_the_newest_complete_checkpoint_whoever_killed_the_run_and_whenever(target, layout):
    saves, gaps, after, how = layout
    ckpt = Path(target.checkpoint_dir)
    for old in ckpt.iterdir():
        old.unlink()
    at = 1_000_000.0
    for (name, data), gap in zip(saves, gaps, strict=True):
        at += gap
        put(ckpt / name, data, at)
    death = at + after
    run = {
        "sigkill": RunFacts(started_at=1.0, exit_code=137, exit_at=death),
        "sigterm": RunFacts(started_at=1.0, exit_code=143, exit_at=death),
        "exit_1": RunFacts(started_at=1.0, exit_code=1, exit_at=death),
        "adopted": RunFacts(started_at=1.0),
        "stop_killed": RunFacts(started_at=1.0, stop_term_at=death - 1.0, stop_killed_at=death, exit_code=137, exit_at=death),
    }[how]
    choice = choose_listed(target, run)
    whole = [name for name, data in saves if data in (TORCH, SAFE)]
    assert choice.name == (whole[-1] if whole else None), describe(choice)
    assert not any("judged by time" in s for s in choice.skipped), choice.skipped


# ---------------------------------------------------------------------------------------------
# Bounded cost


def test_only_the_newest_entries_are_read_and_never_a_big_file_whole(target):
    ckpt = Path(target.checkpoint_dir)
    big = torch_bytes(4, 500_000)  # 2 MB
    for i in range(1, 13):
        put(ckpt / f"step_{i * 10}.pt", big, 1000.0 + i)
    out = listed(target)
    assert len(out) < 2_000_000, f"{len(out)} bytes listed for 24 MB of checkpoints"
    found = read_listing(out)
    assert sorted(found.probes, key=lambda n: step_of(n) or 0) == [f"step_{i * 10}.pt" for i in range(5, 13)]
    choice = choose(found.entries, probes=found.probes, run=found.run)
    assert choice.name == "step_120.pt" and "complete" in choice.why, describe(choice)
    unread = EntryProbe()
    assert choose(found.entries, probes={"step_120.pt": unread}).content.startswith("content not read")  # type: ignore[union-attr]


def test_the_host_reads_a_safetensors_header_whole_and_the_files_a_folder_holds(target):
    ckpt = Path(target.checkpoint_dir)
    many = safetensors_bytes({f"t{i}": 4 for i in range(2000)})  # a header over the first 64 KiB
    put(ckpt / "step_10" / "model.safetensors", many)
    put(ckpt / "step_10" / "trainer_state.json", b"{}")
    found = read_listing(listed(target))
    files = found.probes["step_10"].files
    assert len(files["model.safetensors"].head) == 8 + struct.unpack_from("<Q", many)[0] > 65536
    assert files["trainer_state.json"].head == b"{}"
    choice = choose(found.entries, probes=found.probes)
    assert "Hugging Face Trainer folder: complete" in choice.why, describe(choice)


def test_a_listing_by_hand_reads_every_probe_record():
    listing = "present\n" + "f 5.0 N step_1.pt\0" + "P 1407 UEsDBA== - step_1.pt\0P 3 e30K - step_2/trainer_state.json\0T step_2\0"
    found = read_listing(listing)
    assert found.probes["step_1.pt"].files[""] == Probe(size=1407, head=b"PK\x03\x04", tail=b"")
    assert found.probes["step_2"].files["trainer_state.json"].head == b"{}\n" and found.probes["step_2"].crowded
