"""Secrets in the project's tracked DVC config: refused by the first stage, before any work.

DVC keeps ``.dvc/config`` in git (it is committed with the project) and ``.dvc/config.local`` out of it
(``dvc remote modify --local``). A remote's credentials (an S3 key, a password, a token) written without
``--local`` land in ``.dvc/config`` and from there in every clone and push of the repository.
:func:`check_remote_secrets` names the remote and the option, and the command that moves it.
"""

from __future__ import annotations

import re
from pathlib import Path

from topometrics.errors import TopometricsError

# Options of DVC's remotes (S3, Azure, GCS, SSH, HTTP/WebDAV, OSS, Google Drive) whose values are credentials.
SECRET_OPTIONS = ("access_key_id", "secret_access_key", "session_token", "password", "account_key", "sas_token",
                  "connection_string", "client_secret", "gdrive_client_secret", "oss_key_id", "oss_key_secret",
                  "token")  # fmt: skip
_SECTION = re.compile(r"^\s*\[(.*)\]\s*$")
_REMOTE = re.compile(r"""^'?\s*remote\s+"([^"]+)"\s*'?$""")
_OPTION = re.compile(r"^\s*([A-Za-z_]+)\s*=")


class SecretInConfigError(TopometricsError):
    """A credential in the tracked DVC config; the message names the file, the remote, the option and the fix."""


def remote_secrets(config: Path) -> list[tuple[str, str]]:
    """``(remote, option)`` for every credential in the DVC config file ``config`` (none when it is absent).

    Read line by line (DVC writes sections as ``['remote "name"']`` and indents their options), not parsed:
    a config DVC cannot read is DVC's to report."""
    if not config.is_file():
        return []
    found, remote = [], None
    for line in config.read_text(errors="replace").splitlines():
        if section := _SECTION.match(line):
            remote = (_REMOTE.match(section.group(1)) or [None, None])[1]
        elif remote is not None and (option := _OPTION.match(line)) and option.group(1) in SECRET_OPTIONS:
            found.append((remote, option.group(1)))
    return found


def check_remote_secrets(config: Path = Path(".dvc/config")) -> None:
    """Raise :class:`SecretInConfigError` when ``config`` (the tracked DVC config) holds a remote's credential."""
    if found := remote_secrets(config):
        remote, option = found[0]
        more = f" (and {len(found) - 1} more)" if len(found) > 1 else ""
        raise SecretInConfigError(
            f"{config}: remote {remote!r} holds {option}{more}, which git tracks; move it: dvc remote modify --local "
            f"{remote} {option} <value>, then delete it from {config} (rotate a key already committed)"
        )
