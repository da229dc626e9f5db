"""aptix dev's API key: chosen with --key, else kept beside the SQLite file and reused."""

from __future__ import annotations

from pathlib import Path

from aptix_cli.dev import dev_api_key, key_file


def test_a_new_key_is_kept_for_its_owner_only_and_reused(tmp_path: Path) -> None:
    sqlite = str(tmp_path / "aptix-dev.sqlite")
    first = dev_api_key(sqlite)
    assert first.startswith("dev-") and key_file(sqlite) == tmp_path / "aptix-dev.key"
    assert key_file(sqlite).read_text().strip() == first
    assert key_file(sqlite).stat().st_mode & 0o777 == 0o600
    assert dev_api_key(sqlite) == first


def test_a_chosen_key_wins_and_leaves_the_kept_one_alone(tmp_path: Path) -> None:
    sqlite = str(tmp_path / "aptix-dev.sqlite")
    kept = dev_api_key(sqlite)
    assert dev_api_key(sqlite, "chosen") == "chosen"
    assert dev_api_key(sqlite) == kept
