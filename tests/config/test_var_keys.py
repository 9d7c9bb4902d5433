"""Keys generated under var/ (the embedded default): every process agrees on one, and none reads
one half written (review of issue 21)."""

from __future__ import annotations

import threading
import time
from pathlib import Path

from config.settings.base import _var_key


def test_a_process_reading_while_another_writes_the_key_gets_the_whole_key(
    tmp_path: Path,
) -> None:
    def slow_key() -> str:
        time.sleep(0.5)  # the first process is still writing its key
        return "the-first-key"

    first: list[str] = []
    writer = threading.Thread(target=lambda: first.append(_var_key("k", slow_key, tmp_path)))
    writer.start()
    time.sleep(0.1)
    second = _var_key("k", lambda: "the-second-key", tmp_path)
    writer.join()
    # Whichever linked first wins; both read the same, whole key, never an empty file.
    assert second in {"the-first-key", "the-second-key"}
    assert first == [second]
    assert (tmp_path / "k").read_text() == second
    assert [p.name for p in tmp_path.iterdir()] == ["k"]  # no draft left behind
    assert (tmp_path / "k").stat().st_mode & 0o077 == 0  # readable by its owner only


def test_a_key_once_made_is_kept(tmp_path: Path) -> None:
    assert _var_key("k", lambda: "one", tmp_path) == "one"
    assert _var_key("k", lambda: "two", tmp_path) == "one"
