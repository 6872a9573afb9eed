"""The API key and the admin token of `serve`: from a file (--api-key-file, --admin-token-file)
or the environment ($FREETOKEN_API_KEY, $FREETOKEN_ADMIN_TOKEN), so that they need not be on
the command line, where every local user sees them (`ps`, /proc/PID/cmdline). --api-key and
--admin-token still work, with a warning."""
from __future__ import annotations

import logging
import os
import stat
from pathlib import Path

log = logging.getLogger("freetoken.server")

MAX_KEY_FILE = 4096
# (argument, its file argument, environment variable)
SECRETS = (("api_key", "api_key_file", "FREETOKEN_API_KEY"),
           ("admin_token", "admin_token_file", "FREETOKEN_ADMIN_TOKEN"))


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def read_key_file(flag: str, path: str) -> str:
    """The key a file holds (surrounding whitespace and the final newline dropped), or a
    one-line SystemExit naming the flag, the file and what is wrong."""
    where = f"freetoken serve: {flag} {path}"
    try:
        st = os.stat(path)
        if not stat.S_ISREG(st.st_mode):      # a FIFO or a device would block or never end
            raise SystemExit(f"{where}: not a regular file")
        if st.st_size > MAX_KEY_FILE:
            raise SystemExit(f"{where}: {st.st_size} bytes; a key file holds one key "
                             f"(at most {MAX_KEY_FILE} bytes)")
        text = Path(path).read_bytes().decode("utf-8")
    except OSError as e:
        raise SystemExit(f"{where}: cannot read it ({e.strerror or type(e).__name__})") from None
    except UnicodeDecodeError:
        raise SystemExit(f"{where}: not UTF-8 text") from None
    key = text.strip()
    if not key:
        raise SystemExit(f"{where}: the file is empty; expected the key on one line")
    if any(c.isspace() or not c.isprintable() for c in key):
        raise SystemExit(f"{where}: the key holds whitespace or control characters; expected "
                         "one key on one line")
    return key


def resolve_keys(args) -> None:
    """Set args.api_key and args.admin_token from the flag, the file or the environment
    (in that order; a flag and its file together are an error). Once per args."""
    if getattr(args, "keys_resolved", False):
        return
    args.keys_resolved = True
    for name, file_name, env in SECRETS:
        given, path = getattr(args, name, None), getattr(args, file_name, None)
        if given and path:
            raise SystemExit(f"freetoken serve: give {_flag(name)} or {_flag(file_name)}, not both")
        if given:
            log.warning("%s on the command line is visible to every local user (ps); prefer %s "
                        "or $%s", _flag(name), _flag(file_name), env)
        elif path:
            setattr(args, name, read_key_file(_flag(file_name), path))
        else:
            setattr(args, name, os.environ.get(env) or None)
