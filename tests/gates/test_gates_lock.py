"""gates.lock: tampering (modified, added, removed file) is detected; relock accepts."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

import gates
from gates.lock import LOCK_NAME, GateTampered, digest_tree, relock, verify

GATES_DIR = Path(gates.__file__).resolve().parent


@pytest.fixture()
def gates_copy(tmp_path: Path) -> Path:
    dst = tmp_path / "gates"
    shutil.copytree(GATES_DIR, dst, ignore=shutil.ignore_patterns("__pycache__"))
    relock("test", root=dst)
    return dst


def test_repo_lock_matches() -> None:
    verify()  # the committed gates/ must match the committed lock


def test_clean_copy_verifies(gates_copy: Path) -> None:
    assert set(verify(gates_copy)) == set(digest_tree(gates_copy))
    assert "thresholds.toml" in digest_tree(gates_copy)
    assert any(p.startswith("data/") for p in digest_tree(gates_copy))


def test_modified_file_mid_run(gates_copy: Path) -> None:
    verify(gates_copy)  # run start: fine
    path = gates_copy / "thresholds.toml"
    path.write_text(path.read_text().replace("[accuracy.hard]", "[accuracy.hard]\nmean_abs_dlogprob = 9.0", 1))
    with pytest.raises(GateTampered) as exc:
        verify(gates_copy)  # before the next trial: caught
    assert exc.value.changed == ["thresholds.toml"]
    assert "thresholds.toml" in str(exc.value) and "infergoal gates relock" in str(exc.value)


def test_added_and_removed_files(gates_copy: Path) -> None:
    (gates_copy / "data" / "extra.txt").write_text("new reference data")
    (gates_copy / "performance.py").unlink()
    with pytest.raises(GateTampered) as exc:
        verify(gates_copy)
    assert exc.value.added == ["data/extra.txt"]
    assert exc.value.removed == ["performance.py"]


def test_symlink_counts_as_added(gates_copy: Path, tmp_path: Path) -> None:
    (tmp_path / "elsewhere.py").write_text("x = 1\n")
    (gates_copy / "shim.py").symlink_to(tmp_path / "elsewhere.py")
    with pytest.raises(GateTampered, match="shim.py"):
        verify(gates_copy)


def test_missing_lock(gates_copy: Path) -> None:
    (gates_copy / LOCK_NAME).unlink()
    with pytest.raises(GateTampered, match="lock unreadable"):
        verify(gates_copy)


def test_relock_accepts_and_reports(gates_copy: Path) -> None:
    (gates_copy / "accuracy.py").write_text("# edited\n")
    (gates_copy / "data" / "new.txt").write_text("more")
    assert relock("alice", root=gates_copy) == ["accuracy.py", "data/new.txt"]
    verify(gates_copy)
    assert relock("alice", root=gates_copy) == []  # nothing changed since


def test_pycache_ignored(gates_copy: Path) -> None:
    (gates_copy / "__pycache__").mkdir(exist_ok=True)
    (gates_copy / "__pycache__" / "x.cpython-311.pyc").write_bytes(b"\0")
    verify(gates_copy)


def test_public_names() -> None:
    assert gates.__all__ == ["GateResult", "GateTampered", "Status", "load_thresholds", "relock", "verify_lock"]
    result = gates.GateResult("accuracy", "pass", "ok")
    with pytest.raises(AttributeError):
        result.status = "fail"  # type: ignore[misc]
