"""The tiny model folder is installed whole (jitserve.devstack.tinymodel): pytest-xdist
workers on a fresh cache build it at once, and a vLLM one of them starts must never read
a file another is rewriting. The builders here write stand-in files (the real ones need
the ``tokenizers`` package of vLLM's environment)."""

from __future__ import annotations

import threading
from pathlib import Path

from jitserve.devstack import tinymodel

FILES = ("config.json", "tokenizer.json", "tokenizer_config.json")
BUILDERS = 4


def test_concurrent_builders_install_one_whole_folder_and_leave_nothing_else(
        tmp_path: Path) -> None:
    out = tmp_path / "models" / tinymodel.MODEL_NAME
    all_mid_build = threading.Barrier(BUILDERS, timeout=30)
    seen: list[str] = []

    def builder(name: str) -> None:
        def build(folder: Path) -> None:
            (folder / FILES[0]).write_text(name)
            all_mid_build.wait()  # every builder has begun and none has installed
            for file in FILES[1:]:
                (folder / file).write_text(name)
            # what a vLLM started now would read: nothing yet, or one builder's whole copy
            if out.exists():
                seen.append(str({(out / f).read_text() for f in FILES}))

        assert tinymodel.install_model_folder(out, build) == out

    threads = [threading.Thread(target=builder, args=(f"builder-{i}",))
               for i in range(BUILDERS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert tinymodel.is_tiny_model(out)
    winners = {(out / f).read_text() for f in FILES}
    assert len(winners) == 1, winners  # one builder's files, none mixed in from another
    assert all(s == str(winners) for s in seen), seen  # the installed copy never changed
    assert [p.name for p in out.parent.iterdir()] == [out.name]  # the losers' copies gone


def test_an_incomplete_folder_in_the_way_is_replaced(tmp_path: Path) -> None:
    out = tmp_path / tinymodel.MODEL_NAME
    out.mkdir()
    (out / "tokenizer.json").write_text('{"half')  # a build cut off before its marker
    assert not tinymodel.is_tiny_model(out)

    def build(folder: Path) -> None:
        for file in FILES:
            (folder / file).write_text("whole")

    tinymodel.install_model_folder(out, build)
    assert tinymodel.is_tiny_model(out)
    assert {(out / f).read_text() for f in FILES} == {"whole"}
    assert [p.name for p in tmp_path.iterdir()] == [out.name]


def test_a_complete_folder_is_kept_without_building(tmp_path: Path) -> None:
    out = tmp_path / tinymodel.MODEL_NAME

    def build(folder: Path) -> None:
        (folder / "config.json").write_text("first")

    tinymodel.install_model_folder(out, build)
    # make_tiny_model would need tokenizers to build: a complete folder needs none
    assert tinymodel.make_tiny_model(out) == out
    assert (out / "config.json").read_text() == "first"
