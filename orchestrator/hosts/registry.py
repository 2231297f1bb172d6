"""Named SSH hosts of a workspace: `.infergoal/hosts.json`, managed by `infergoal hosts add|remove`."""

from __future__ import annotations

import json
from pathlib import Path

from orchestrator.hosts.base import HostError
from orchestrator.hosts.sshconn import HostSpec, parse_ssh_url

__all__ = ["HostRegistry", "resolve_spec"]


class HostRegistry:
    """Host specs by name, in one JSON file under the workspace's state dir."""

    def __init__(self, state_dir: str | Path) -> None:
        self.path = Path(state_dir) / "hosts.json"

    def _load(self) -> dict[str, dict]:
        if not self.path.is_file():
            return {}
        try:
            return json.loads(self.path.read_text())
        except ValueError as e:
            raise HostError(f"{self.path} is not valid JSON ({e}); fix or delete it, then `infergoal hosts add` again") from None

    def names(self) -> list[str]:
        return sorted(self._load())

    def get(self, name: str) -> HostSpec:
        data = self._load()
        if name not in data:
            raise HostError(f"no host named {name!r}; add it with `infergoal hosts add {name} ssh://user@host:port`")
        return HostSpec(**data[name])

    def add(self, spec: HostSpec) -> None:
        data = self._load()
        data[spec.name] = spec.model_dump()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")

    def remove(self, name: str) -> None:
        data = self._load()
        if name not in data:
            raise HostError(f"no host named {name!r}; `infergoal hosts list` shows the known ones")
        del data[name]
        self.path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")


def resolve_spec(name_or_url: str, state_dir: str | Path) -> HostSpec:
    """A registered host by name, or an ad-hoc `ssh://user@host:port`."""
    if name_or_url.startswith("ssh://"):
        return parse_ssh_url(name_or_url)
    return HostRegistry(state_dir).get(name_or_url)
