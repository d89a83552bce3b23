"""``llog auth``: mint API keys and check auth files (docs/operations.md, Security)."""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from pathlib import Path
from typing import Any

from app.auth.apikeys import mint
from app.auth.authfile import AuthFileError, load
from app.settings import Settings

_PRINCIPAL = re.compile(r"[!-~]{1,256}")


def _principal(text: str) -> str:
    if not _PRINCIPAL.fullmatch(text):
        raise argparse.ArgumentTypeError("1 to 256 printable ASCII characters, no spaces")
    return text


def cmd_new_key(args: argparse.Namespace) -> int:
    """Print a new key once, and the entry the auth file keeps of it."""
    token, stored = mint()
    principal = json.dumps(args.principal)  # a TOML basic string is a JSON string
    print(f"# API key for {args.principal} (shown once; give it to the client as "
          f"'Authorization: Bearer <key>'):", file=sys.stderr)
    print(token)
    print("# add to the auth file (a principal may hold several keys; remove one to "
          "revoke it):", file=sys.stderr)
    print(f"[principals.{principal}]\nkeys = [\"{stored}\"]", file=sys.stderr)
    return 0


def cmd_check(args: argparse.Namespace) -> int:
    path = Path(args.file or os.environ.get("LLOG_AUTH_FILE") or "")
    if not str(path) or str(path) == ".":
        print("llog auth check: name the file (or set LLOG_AUTH_FILE)", file=sys.stderr)
        return 2
    try:
        config = load(path, Settings.from_env().auth_file_max_bytes)
    except AuthFileError as exc:
        print(f"llog auth check: {exc}", file=sys.stderr)
        return 1
    print(f"{path}: {len(config.principals)} principals, {len(config.keys)} API keys")
    return 0


def add_auth_commands(sub: Any) -> None:
    auth = sub.add_parser("auth", help="API keys and the auth file")
    commands = auth.add_subparsers(dest="auth_command", required=True)
    new_key = commands.add_parser(
        "new-key", help="mint an API key: the key on stdout, its auth-file entry on stderr")
    new_key.add_argument("principal", type=_principal,
                         help="who the key is for (the ACLs' name for it)")
    new_key.set_defaults(func=cmd_new_key)
    check = commands.add_parser("check", help="parse an auth file and report problems")
    check.add_argument("file", nargs="?", help="the file (default: LLOG_AUTH_FILE)")
    check.set_defaults(func=cmd_check)
